"""Slots a layer registers as ``None`` survive a refit and its rollback (real vLLM, CPU).

vLLM's fused-MoE layer registers ``_expert_map`` as a ``None`` buffer when experts are not split
across ranks, and reads it through the ``expert_map`` property on every forward. A refit that put
back only the tensors it had recorded dropped the slot, so the first forward after a refit raised
``AttributeError: 'RoutedExperts' object has no attribute 'expert_map'`` (seen with vLLM's Marlin
MoE kernel on an H100; the CPU tests never ran a MoE forward). Checked here on the layer itself.
"""

from __future__ import annotations

import pytest
import torch
from moe_helpers import WEIGHTS_A, WEIGHTS_B, loaded_model
from nvfp4_helpers import items
from patchkit.patches.vllm.refit import RefitError, refit_weights


def empty_slots(layer: torch.nn.Module) -> set[str]:
    return {f"buffer {n}" for n, b in layer._buffers.items() if b is None} | {
        f"parameter {n}" for n, p in layer._parameters.items() if p is None}


def test_moe_refit_keeps_the_none_expert_map(nvfp4_refit_patch: None, vllm_config: object) -> None:
    model = loaded_model(WEIGHTS_A)
    slots = empty_slots(model.routed)
    assert "buffer _expert_map" in slots
    refit_weights(model, items(WEIGHTS_B))
    assert empty_slots(model.routed) == slots
    assert model.routed.expert_map is None


def test_a_failed_moe_refit_keeps_the_none_expert_map(nvfp4_refit_patch: None, vllm_config: object) -> None:
    model = loaded_model(WEIGHTS_A)
    slots = empty_slots(model.routed)
    broken = dict(WEIGHTS_B)
    broken["experts.3.down_proj.weight"] = broken["experts.3.down_proj.weight"][:, :-1]
    with pytest.raises(RefitError):
        refit_weights(model, items(broken))
    assert empty_slots(model.routed) == slots
    assert model.routed.expert_map is None
