"""Checkpoint parameters a ModelOpt NVFP4 layer registers but never reads, per method and version.

A refit built from a layer's own parameters (not from what a first load wrote) must know which of
them are placeholders: loaded when a checkpoint carries them, not demanded when it does not.
Read from vLLM's ``quantization/modelopt.py`` of each range:

- 0.21-0.29 ``ModelOptNvFp4W4A16LinearMethod`` registers ``input_scale`` "so W4A4-shaped
  checkpoints can be loaded" and deletes it unread in ``process_weights_after_loading``.
- 0.30+ ``ModelOptLinearMethod`` for ``W4A16_NVFP4`` (no activation scheme) registers it through
  ``_DropInputScale`` (NaN-filled) and drops it the same way.
- ``ModelOptNvFp4FusedMoE`` in W4A16 mode (``use_a16``, 0.21+) runs Marlin, whose MoE path drops the
  activation scales; with a per-token activation override (0.33) processing overwrites them with 1.
- compressed-tensors ``CompressedTensorsW4A4Nvfp4MoEMethod`` with ``use_a16`` (an NVFP4A16 checkpoint;
  0.29+ keep the flag, ``vllm.compressed_tensors_nvfp4_refit`` keeps it on 0.24-0.28) registers
  ``w13/w2_input_global_scale``, which such a checkpoint does not carry.
- Every W4A4 method reads every parameter it registers: nothing is optional there.
"""

from __future__ import annotations

from typing import Any

_MOE_INPUT_SCALES = frozenset({"w13_input_scale", "w2_input_scale"})
_LINEAR_INPUT_SCALE = frozenset({"input_scale"})
_CT_MOE_INPUT_SCALES = frozenset({"w13_input_global_scale", "w2_input_global_scale"})


def unread_placeholders(method: Any) -> frozenset[str]:
    """Names of the parameters ``method``'s ``create_weights`` registers that its processing ignores."""
    name = type(method).__name__
    if name == "ModelOptNvFp4W4A16LinearMethod":
        return _LINEAR_INPUT_SCALE
    if name == "ModelOptLinearMethod":
        spec = getattr(method, "spec", None)
        weight_only = spec is not None and getattr(spec, "activation", True) is None
        return _LINEAR_INPUT_SCALE if weight_only else frozenset()
    if name == "ModelOptNvFp4FusedMoE":
        if getattr(method, "use_a16", False) or getattr(method, "per_token_activation", False):
            return _MOE_INPUT_SCALES
    if name == "CompressedTensorsW4A4Nvfp4MoEMethod" and getattr(method, "use_a16", False):
        return _CT_MOE_INPUT_SCALES
    return frozenset()
