"""Router replay on megatron-core's TransformerEngine layer spec equals the local-spec results (CUDA, real TE).

Marked ``gpu``; skipped without CUDA or without a real TransformerEngine. The tiny MoE GPT of
``replay_models`` (local spec, two 8-expert top-2 MoE layers, sigmoid scores with an expert bias) is
rebuilt with ``get_gpt_layer_with_transformer_engine_spec`` and given the same weights and expert
biases: TE fuses the input layer norm into the QKV linear (``input_layernorm.*`` becomes
``self_attention.linear_qkv.layer_norm_*``); the MoE layer keeps its own ``pre_mlp_layernorm``
(TENorm) and its experts become TE linears of the same names. Each model is driven through
``router_replay.for_model`` (both models' routers live in the same process).

Checked: routes recorded on one spec and replayed on the other (after both models' expert biases
moved, so a fresh pass would route elsewhere) give the recording model's routing maps exactly, and
its routing probabilities, MoE-layer outputs and per-token loss within tolerance; the TE spec
replaying its own recording reproduces that pass; replaying a recording of another batch does not.

Tolerance: routing maps and replayed indices are integers and must be equal. Floats are fp32 but
TE runs fp32 GEMMs in TF32 (10-bit mantissa) where the local spec's ``torch.matmul`` does not, so
the two specs differ by rounding: probabilities and loss within 1e-3 (as the MTP TE test, whose
logits differed by up to 1.9e-4), each MoE layer's output within 1% of that output's largest
magnitude (its values are small, so an absolute bound would not tell a wrong route from rounding;
a wrong route changes an output by the order of the output itself).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from megatron_gpu_setup import REQUIRES_TE
from megatron_gpu_setup import te_twin as shared_te_twin
from patchkit.patches.megatron import router_replay as replay
from replay_models import (
    NUM_EXPERTS,
    REPLAY_PATCH_IDS,
    Batch,
    RoutingCapture,
    build_tiny_moe,
    causal_batch,
    forward_loss,
    shift_expert_bias,
)

import patchkit

log = logging.getLogger(__name__)

pytestmark = [
    pytest.mark.gpu,
    REQUIRES_TE,
]
FLOAT_TOL = 1e-3  # probabilities and loss: TF32 (TE) against fp32 (local) GEMMs
OUTPUT_TOL = 1e-2  # MoE-layer output, relative to its largest magnitude


@pytest.fixture
def te_replay_gpu(megatron_gpu: None) -> Iterator[torch.device]:
    """NCCL world of one with the replay patches applied; replay state reset before and after."""
    with patchkit.applied(*REPLAY_PATCH_IDS):
        replay.reset()
        yield torch.device("cuda", 0)
        replay.reset()


def te_twin(local: Any) -> Any:
    """The same MoE model on the TE spec, with ``local``'s weights and expert biases (fused norms renamed)."""
    twin = shared_te_twin(local, num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    with torch.no_grad():
        for local_router, te_router in zip(_routers(local), _routers(twin), strict=True):
            te_router.expert_bias.copy_(local_router.expert_bias)
    return twin


def _routers(model: Any) -> list[Any]:
    from replay_models import routers

    return routers(model)


def _moe_layers(model: Any) -> list[Any]:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    return [m for m in model.modules() if isinstance(m, MoELayer)]


class Pass:
    """One forward of ``model``: routing maps and probs per router, MoE outputs, per-token loss."""

    def __init__(self, model: Any, batch: Batch) -> None:
        capture = RoutingCapture(model)
        outputs: list[torch.Tensor] = []
        hooks = [layer.register_forward_hook(lambda _m, _i, out: outputs.append(out[0].detach().clone()))
                 for layer in _moe_layers(model)]
        try:
            with torch.no_grad():
                self.loss = forward_loss(model, batch).detach()
            self.maps = capture.take()
            self.probs = capture.last_probs
        finally:
            capture.remove()
            for hook in hooks:
                hook.remove()
        self.outputs = outputs
        assert len(self.maps) == len(self.outputs) == 2


def run(model: Any, batch: Batch, action: str | None, targets: dict[Any, torch.Tensor] | None = None) -> Pass:
    routers = replay.for_model(model)
    if targets is not None:
        routers.set_targets(targets)
    routers.set_action(action)
    try:
        return Pass(model, batch)
    finally:
        routers.set_action(None)


def recording(model: Any, batch: Batch) -> tuple[Pass, dict[Any, torch.Tensor]]:
    recorded = run(model, batch, "record")
    return recorded, {key: t.clone() for key, t in replay.for_model(model).recorded().items()}


def output_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference relative to the largest magnitude of ``want``."""
    return float((got - want).abs().max() / want.abs().max())


def assert_same_routes_within_rounding(got: Pass, want: Pass, what: str) -> None:
    for layer, (g, w) in enumerate(zip(got.maps, want.maps, strict=True)):
        assert torch.equal(g, w), f"{what}: routing map of MoE layer {layer} differs"
    for layer, (g, w) in enumerate(zip(got.probs, want.probs, strict=True)):
        torch.testing.assert_close(g, w, atol=FLOAT_TOL, rtol=FLOAT_TOL, msg=f"{what}: probs of MoE layer {layer}")
    errors = [output_error(g, w) for g, w in zip(got.outputs, want.outputs, strict=True)]
    loss_error = float((got.loss - want.loss).abs().max())
    log.info("%s: MoE output error (relative to max) %s, loss max abs diff %.3g", what, errors, loss_error)
    assert max(errors) <= OUTPUT_TOL, f"{what}: MoE outputs differ by {errors}"
    torch.testing.assert_close(got.loss, want.loss, atol=FLOAT_TOL, rtol=FLOAT_TOL, msg=f"{what}: loss")


def _models(device: torch.device) -> tuple[Any, Any]:
    local = build_tiny_moe().to(device)
    twin = te_twin(local)
    assert type(twin.decoder.layers[0].self_attention.linear_qkv).__name__ == "TELayerNormColumnParallelLinear"
    assert type(twin.decoder.layers[0].mlp.experts.local_experts[0].linear_fc1).__name__ == "TEColumnParallelLinear"
    return local, twin


def _move_biases(*models: Any) -> None:
    """The same bias shift on every model: a fresh pass routes elsewhere, the selected probs stay."""
    for model in models:
        shift_expert_bias(model)


def _on_cuda(batch: Batch, device: torch.device) -> Batch:
    return batch.to(device)


@pytest.mark.parametrize("recorder", ["local", "te"])
def test_routes_recorded_on_one_spec_replay_on_the_other(te_replay_gpu: torch.device, recorder: str) -> None:
    local, twin = _models(te_replay_gpu)
    batch = _on_cuda(causal_batch(), te_replay_gpu)
    source, target = (local, twin) if recorder == "local" else (twin, local)
    recorded, indices = recording(source, batch)

    _move_biases(local, twin)
    fresh = run(target, batch, None)
    assert any(not torch.equal(f, r) for f, r in zip(fresh.maps, recorded.maps, strict=True)), \
        "the bias shift must change the routing, or replaying would prove nothing"
    replayed = run(target, batch, "replay_forward", indices)
    assert_same_routes_within_rounding(replayed, recorded, f"{recorder} recording replayed on the other spec")


def test_te_spec_replays_its_own_recording_and_matches_the_local_spec(te_replay_gpu: torch.device) -> None:
    local, twin = _models(te_replay_gpu)
    batch = _on_cuda(causal_batch(), te_replay_gpu)
    te_recorded, te_indices = recording(twin, batch)
    local_recorded, _ = recording(local, batch)

    _move_biases(local, twin)
    te_replayed = run(twin, batch, "replay_forward", te_indices)
    for layer, (g, w) in enumerate(zip(te_replayed.maps, te_recorded.maps, strict=True)):
        assert torch.equal(g, w), f"TE replay: routing map of MoE layer {layer}"
    torch.testing.assert_close(te_replayed.loss, te_recorded.loss, atol=1e-6, rtol=1e-6)
    assert_same_routes_within_rounding(te_replayed, local_recorded, "TE replay of its recording vs local recording")


def test_replaying_another_batchs_recording_differs(te_replay_gpu: torch.device) -> None:
    local, twin = _models(te_replay_gpu)
    batch = _on_cuda(causal_batch(), te_replay_gpu)
    local_recorded, _ = recording(local, batch)
    _, other_indices = recording(local, _on_cuda(causal_batch(seed=8), te_replay_gpu))

    wrong = run(twin, batch, "replay_forward", other_indices)
    assert any(not torch.equal(w, r) for w, r in zip(wrong.maps, local_recorded.maps, strict=True))
    errors = [output_error(w, r) for w, r in zip(wrong.outputs, local_recorded.outputs, strict=True)]
    log.info("another batch's recording: MoE output error (relative to max) %s", errors)
    assert max(errors) > OUTPUT_TOL
    with pytest.raises(AssertionError):
        assert_same_routes_within_rounding(wrong, local_recorded, "another batch's recording")
