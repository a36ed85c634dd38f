"""``modelopt.max_calibrator_nan_safe``: ModelOpt's ``MaxCalibrator.collect`` on NaN and inf inputs.

Upstream (0.43-0.48) asserts that the amax is finite, so one overflowed activation during a calibration
on dummy weights aborts ``mtq.quantize``; the patch zero-fills non-finite inputs first, as NeMo-RL's
rollout worker does for its dummy-weight calibration. Each test calls ModelOpt's own calibrator or
``mtq.quantize``; environments: every modelopt-* environment (0.43, 0.44, 0.47, 0.48).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from doctor_verdicts import verdict_of
from patchkit.patches.modelopt._checks.max_calibrator_nan_safe import collect_amax, dummy_activations

import patchkit
from patchkit.doctor import FAILED, VERIFIED
from patchkit.selfcheck import upstream_behaviour

PATCH = "modelopt.max_calibrator_nan_safe"

pytestmark = pytest.mark.usefixtures("patches_restored")


@pytest.fixture
def applied():
    with patchkit.applied(PATCH) as (record,):
        assert record.state.installed, record.to_dict()
        yield record


def _as_upstream():
    """Upstream's own ``collect``, even where an earlier test of the session left the patch applied."""
    left_applied = bool(patchkit.engine().installed_actions(PATCH))
    return upstream_behaviour(PATCH) if left_applied else contextlib.nullcontext()


class _Overflowing(torch.nn.Module):
    """A linear layer whose input overflows to NaN/inf, as deep layers on dummy weights do."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _quantize_on_overflowing_activations() -> torch.nn.Module:
    import modelopt.torch.quantization as mtq

    torch.manual_seed(0)
    model = _Overflowing()

    def forward_loop(module: torch.nn.Module) -> None:
        module(dummy_activations())

    return mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop=forward_loop)


def test_upstream_collect_asserts_on_nan():
    """Upstream pinned: the failure the patch exists for."""
    with _as_upstream():
        error, amax = collect_amax(dummy_activations())
    assert isinstance(error, AssertionError), error
    assert "detected nan values in amax" in str(error)
    assert amax is None


def test_upstream_quantize_aborts_on_overflowed_calibration_activations():
    with _as_upstream(), pytest.raises(AssertionError, match="detected nan values in amax"):
        _quantize_on_overflowing_activations()


def test_collect_zero_fills_nan_and_inf(applied):
    error, amax = collect_amax(dummy_activations())
    assert error is None
    assert float(amax) == 3.0


def test_per_channel_amax_of_an_all_nan_input_is_zero(applied):
    error, amax = collect_amax(torch.full((2, 4), float("nan")), axis=0)
    assert error is None
    assert amax.flatten().tolist() == [0.0, 0.0]


def test_quantize_calibrates_on_overflowed_activations(applied):
    model = _quantize_on_overflowing_activations()
    input_amax = model.linear.input_quantizer.amax
    assert torch.isfinite(input_amax).all()
    assert float(input_amax) == 3.0


def test_finite_inputs_give_upstreams_amax(applied):
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    patched = collect_amax(x, axis=0)[1]
    with upstream_behaviour(PATCH):
        upstream = collect_amax(x, axis=0)[1]
    assert torch.equal(patched, upstream)


def test_meta_inputs_reach_upstream_unchanged(applied):
    error, amax = collect_amax(torch.empty(2, 4, device="meta"), axis=0)
    assert error is None
    assert amax.device.type == "meta"


def test_max_calibrator_nan_safe_check_is_verified(applied):
    verdict = verdict_of(PATCH)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("modelopt.max_calibrator_nan_safe")
def test_max_calibrator_nan_safe_check_fails_with_upstreams_collect(applied):
    verdict = verdict_of(PATCH, as_upstream=True)
    assert verdict.verdict == FAILED
    assert "MaxCalibrator.collect on an input with NaN and inf: expected no error, found AssertionError" \
        in verdict.message, verdict.message
