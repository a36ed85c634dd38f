"""Qwen3.5 configs as vLLM loads them: the driver of the ``vllm.qwen3_5_text_config_defaults`` self-check
and its tests.

vLLM 0.17-0.31 register config classes of their own for ``qwen3_5`` / ``qwen3_5_moe`` (and their
``*_text`` sub-configs); 0.32 removed them and loads transformers' classes. Either way the config a
model gets is what vLLM's ``get_config`` returns for the model folder, so the driver writes a
``config.json`` into a fresh folder and asks ``get_config`` for it: the class under test is whichever
one vLLM picks on the installed release.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

#: The attributes transformers v4's ``PretrainedConfig.__init__`` takes as explicit parameters (with its
#: own defaults: ``tie_word_embeddings=True``) and sets after a subclass's assignments made before
#: ``super().__init__()``.
SPECIAL_ATTRIBUTES = ("tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id")

#: What Qwen3.5's text configs declare for :data:`SPECIAL_ATTRIBUTES` when a config leaves them out
#: (the signatures of vLLM's and of transformers' ``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig``).
DECLARED_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": False, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
}

#: Values a checkpoint sets instead (a small Qwen3.5 ties its embeddings; 248044 is Qwen3.5's
#: ``<|im_end|>``, 248320 its vocabulary size). Each differs from its default.
GIVEN_VALUES: dict[str, Any] = {
    "tie_word_embeddings": True, "pad_token_id": 248044, "bos_token_id": 248045, "eos_token_id": 248046,
}

#: Qwen3.5's multimodal RoPE: the two mRoPE keys are not RoPE parameters transformers validates; the
#: text configs name them in ``ignore_keys_at_rope_validation``.
MROPE_PARAMETERS: dict[str, Any] = {
    "rope_type": "default", "rope_theta": 10_000_000, "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10], "mrope_interleaved": True,
}


class Family(NamedTuple):
    """One Qwen3.5 family: the composite ``model_type`` of its ``config.json`` and its text sub-config's."""

    model_type: str
    text_model_type: str
    architecture: str
    text_fields: dict[str, Any]


#: Each family with a small text part (the sizes do not matter to what is checked).
FAMILIES = (
    Family("qwen3_5", "qwen3_5_text", "Qwen3_5ForConditionalGeneration",
           {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4}),
    Family("qwen3_5_moe", "qwen3_5_moe_text", "Qwen3_5MoeForConditionalGeneration",
           {"hidden_size": 256, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
            "num_hidden_layers": 4}),
)


def config_json(family: Family, text_values: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Qwen3.5 ``config.json`` in the published layout (composite config, ``text_config`` and
    ``vision_config``) whose text part sets ``text_values`` on top of a small model's sizes and the mRoPE
    parameters; without ``text_values`` it leaves :data:`SPECIAL_ATTRIBUTES` to the class defaults."""
    text_config = {"model_type": family.text_model_type, "vocab_size": 248320,
                   "rope_parameters": copy.deepcopy(MROPE_PARAMETERS), **family.text_fields, **(text_values or {})}
    return {
        "architectures": [family.architecture], "model_type": family.model_type,
        "image_token_id": 248056, "video_token_id": 248057,
        "vision_start_token_id": 248053, "vision_end_token_id": 248054,
        "text_config": text_config,
        "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
                          "out_hidden_size": family.text_fields["hidden_size"]},
    }


def load_with_vllm(config: dict[str, Any]) -> Any:
    """The config vLLM's ``get_config`` returns for a model folder holding ``config`` as its
    ``config.json`` (a fresh folder each call: nothing cached from an earlier load)."""
    from vllm.transformers_utils.config import get_config

    with tempfile.TemporaryDirectory(prefix="qwen3_5_config_") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        return get_config(folder, trust_remote_code=False)


def text_config_class(family: Family) -> type:
    """The class vLLM builds the family's ``text_config`` with on the installed release."""
    return type(load_with_vllm(config_json(family)).text_config)


def special_attributes(config: Any) -> dict[str, Any]:
    """:data:`SPECIAL_ATTRIBUTES` as ``config`` ends with them (``"<missing>"`` where one is not set)."""
    return {name: getattr(config, name, "<missing>") for name in SPECIAL_ATTRIBUTES}
