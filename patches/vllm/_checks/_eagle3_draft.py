"""A tiny EAGLE-3 Llama draft (``Eagle3LlamaForCausalLM``) built on CPU the way vLLM builds one, and the
proposer's decision on its ``lm_head``.

Shared by the ``vllm.eagle3_own_lm_head`` self-check and its tests. The configs are vLLM's own: a
``ModelConfig`` read offline from a tiny Llama ``config.json`` (the target) and a ``SpeculativeConfig``
(``method="eagle3"``) read from a draft ``config.json`` with ``draft_vocab_size``. No weights are loaded
(as with ``load_format="dummy"``): ``has_own_lm_head`` is what the constructor leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ._cpu_stand_in import cpu_activation_op

TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "vocab_size": 256, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "torch_dtype": "float32",
}


def target_model_config(directory: Path) -> Any:
    """vLLM's ``ModelConfig`` for the tiny Llama target, its ``config.json`` written to ``directory``."""
    from vllm.config import ModelConfig

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TARGET_CONFIG))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return ModelConfig(model=str(directory), skip_tokenizer_init=True, dtype="float32")


def eagle3_vllm_config(model_config: Any, directory: Path, draft_vocab_size: int) -> Any:
    """A ``VllmConfig`` speculating with a one-layer EAGLE-3 draft of ``draft_vocab_size`` tokens."""
    from vllm.config import ParallelConfig, SpeculativeConfig, VllmConfig

    directory.mkdir(parents=True, exist_ok=True)
    draft = dict(TARGET_CONFIG, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab_size)
    (directory / "config.json").write_text(json.dumps(draft))
    parallel_config = ParallelConfig()
    speculative_config = SpeculativeConfig(method="eagle3", model=str(directory), num_speculative_tokens=1,
                                           target_model_config=model_config,
                                           target_parallel_config=parallel_config)
    return VllmConfig(model_config=model_config, parallel_config=parallel_config,
                      speculative_config=speculative_config)


def build(model_class: type, vllm_config: Any) -> Any:
    """``model_class(vllm_config=...)`` on CPU under ``vllm_config`` (vLLM's model-parallel state must exist).

    Attention layers register their names in the config's forward context and refuse a name taken: the
    entries of a model built before from the same config are dropped first (only the newest is used)."""
    from vllm.config import set_current_vllm_config

    vllm_config.compilation_config.static_forward_context.clear()
    with set_current_vllm_config(vllm_config), torch.device("cpu"), cpu_activation_op():
        return model_class(vllm_config=vllm_config)


def eagle3_draft(vllm_config: Any) -> Any:
    """vLLM's ``Eagle3LlamaForCausalLM`` for ``vllm_config``'s draft, built as its loader builds it."""
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

    return build(Eagle3LlamaForCausalLM, vllm_config)


def llama_target(vllm_config: Any) -> Any:
    """vLLM's ``LlamaForCausalLM`` for ``vllm_config``'s target model."""
    from vllm.model_executor.models.llama import LlamaForCausalLM

    return build(LlamaForCausalLM, vllm_config)


@contextlib.contextmanager
def _no_pinned_buffers(module: Any) -> Iterator[None]:
    """``module.PIN_MEMORY`` (read once as vLLM is imported) False while the proposer's buffers are made:
    without CUDA there is no pinned-memory allocator, and the buffers' memory plays no part here."""
    if not hasattr(module, "PIN_MEMORY") or torch.cuda.is_available():
        yield
        return
    saved = module.PIN_MEMORY
    module.PIN_MEMORY = False
    try:
        yield
    finally:
        module.PIN_MEMORY = saved


def v1_proposer_shares(vllm_config: Any, draft: Any, target: Any) -> bool:
    """Whether vLLM's V1 ``EagleProposer`` (built for ``vllm_config`` on CPU, no runner) gives ``draft`` the
    ``target``'s ``lm_head``: its own ``_maybe_share_lm_head``, as ``load_model`` calls it after loading."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.spec_decode import llm_base_proposer
    from vllm.v1.spec_decode.eagle import EagleProposer

    with set_current_vllm_config(vllm_config), _no_pinned_buffers(llm_base_proposer):
        proposer = EagleProposer(vllm_config, torch.device("cpu"), None)
        proposer.model = draft
        proposer._maybe_share_lm_head(target)
    return draft.lm_head is target.lm_head


def v2_runner_shares(draft: Any, target: Any) -> bool:
    """Whether vLLM's V2 model runner (``load_eagle_model``) would give ``draft`` the ``target``'s ``lm_head``:
    its own ``_should_share``, on the draft's flag and both heads."""
    from vllm.v1.worker.gpu.spec_decode.eagle.utils import _should_share

    return bool(_should_share(draft, "has_own_lm_head", draft.lm_head, target.lm_head))
