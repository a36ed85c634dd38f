"""vLLM's Qwen3.5 text configs keep their declared defaults and a checkpoint's values (native, 0.24-0.33).

Declaration only (see docs/writing-patches.md). ROLL replaces vLLM's ``Qwen3_5TextConfig.__init__`` and
``Qwen3_5MoeTextConfig.__init__`` (its ``patch_transformers.py``, vLLM >= 0.16): transformers v4's
``PretrainedConfig.__init__`` takes ``tie_word_embeddings`` (default ``True``) and the pad/bos/eos token
ids as parameters and sets them itself, so a subclass that assigns them before ``super().__init__()``
loses its own defaults (``tie_word_embeddings=False``) and the checkpoint's values. ROLL's copy assigns
them after, passes ``ignore_keys_at_rope_validation`` as a set (transformers 5.2 joins it to a set with
``|``, which vLLM 0.17-0.18's list fails) and validates ``layer_types`` with transformers'
``layer_type_validation`` (vLLM 0.24-0.31 call ``self.validate_layer_type()``, which transformers 5.2
lacks).

Both are upstream on every release patchkit claims. vLLM 0.16.0 has no Qwen3.5 config; 0.17.0, the
first release with them, already assigns the four attributes after ``super().__init__()``; 0.19 passes a
set; 0.24-0.31 require transformers >= 5.5.3 (whose base config takes none of the four as a parameter)
and keep that code; 0.32 and 0.33 register no Qwen3.5 config of their own and load transformers'
classes. Declared
``native``; the self-check loads a Qwen3.5 and a Qwen3.5-MoE ``config.json`` through vLLM's
``get_config`` and checks the four attributes (defaults and given values) and the mRoPE keys.

Outside the claim: vLLM 0.17-0.18 with transformers 5.x (they require transformers < 5), vLLM 0.24-0.31
with transformers < 5.5.3 (they require >= 5.5.3), and vLLM nightlies before 0.17.0.
"""

from __future__ import annotations

from patchkit import Patch, Variant

PATCHES = (
    Patch(
        id="vllm.qwen3_5_text_config_defaults",
        self_check="._checks.qwen3_5_text_config_defaults:check_qwen3_5_text_config_defaults",
        summary="vLLM's Qwen3.5 text configs keep tie_word_embeddings=False and the checkpoint's token ids (native).",
        why=(
            "Under transformers v4, PretrainedConfig.__init__ sets tie_word_embeddings (default True) and the "
            "pad/bos/eos token ids after a subclass assigned them; ROLL reassigns them in its own copy of "
            "vLLM's Qwen3.5 text config constructors."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.24.0/vllm/transformers_utils/configs/qwen3_5.py",
        removal=(
            "Nothing installed; drop ROLL's patch_transformers.py on vLLM >= 0.19 (>= 0.17 with the "
            "transformers < 5 that 0.17-0.18 require)."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.32"},
                native=(
                    "vLLM's own Qwen3_5TextConfig/Qwen3_5MoeTextConfig assign tie_word_embeddings and the "
                    "pad/bos/eos token ids after PretrainedConfig.__init__, and pass the mRoPE keys as a set"
                ),
                label="vllm-config-classes",
            ),
            Variant(
                requires={"vllm": ">=0.32,<0.34"},
                native="vLLM loads transformers' own Qwen3.5 config classes (it registers none of its own)",
                label="transformers-config-classes",
            ),
        ),
    ),
)
