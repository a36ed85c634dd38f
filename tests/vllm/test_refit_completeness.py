"""A refit is complete or it changes nothing, in every format: coverage, sizes and non-finite values.

For every format and layer type (``refit_formats``), on real vLLM after a dummy start:

- a tensor sent twice in place of another (``up.*`` renamed ``gate.*``, ``experts.1.*`` renamed
  ``experts.0.*``) is refused, naming the parameter written twice; counting elements took it, and the
  unwritten half served uninitialised memory;
- a tensor larger or smaller than the part of the parameter it fills is refused (fused linears
  narrowed an oversized one to its shard without a word);
- NaN/Inf in a weight or a scale is refused, naming it, unless the refit opts out.

Each refusal leaves every kernel tensor as it was, bit for bit, and the next good refit works.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from nvfp4_helpers import assert_same_kernel_state, kernel_state
from patchkit.patches.vllm.refit import RefitError, refit, refit_weights
from refit_formats import FORMATS, format_started

Stream = list[tuple[str, torch.Tensor]]


def _doubled(weights: Stream, moe: bool) -> str:
    """Send one shard (expert) twice, under the other's names: the count of elements still adds up."""
    old, new = ("experts.1.", "experts.0.") if moe else ("up.", "gate.")
    weights[:] = [(new + name[len(old):] if name.startswith(old) else name, tensor) for name, tensor in weights]
    return new


def _resized(factor: float) -> Callable[[Stream, bool], str]:
    def spoil(weights: Stream, moe: bool) -> str:
        prefix = "experts.0.gate_proj." if moe else "gate."
        index, (name, tensor) = next((i, item) for i, item in enumerate(weights)
                                     if item[0].startswith(prefix) and item[0].endswith(("weight", "weight_packed")))
        rows = tensor.shape[0]
        if factor > 1:
            grown = torch.cat([tensor] * int(factor))
        else:
            grown = tensor[: max(1, int(rows * factor))].clone()
        weights[index] = (name, grown)
        return name

    return spoil


def _poisoned(tensor: torch.Tensor, name: str) -> torch.Tensor | None:
    """``tensor`` with one non-finite value, in its own encoding (``None``: the encoding has none)."""
    tensor = tensor.clone()
    flat = tensor.reshape(-1)
    if tensor.dtype == torch.float8_e4m3fn:
        flat.view(torch.uint8)[0] = 0x7F  # E4M3FN NaN
    elif tensor.dtype == torch.uint8 and "scale" in name:
        flat[0] = 0xFF  # E8M0 NaN
    elif tensor.dtype == torch.float8_e8m0fnu:
        flat.view(torch.uint8)[0] = 0xFF  # E8M0 NaN
    elif tensor.is_floating_point():
        flat[0] = float("inf")
    else:
        return None  # packed E2M1 nibbles: no non-finite value exists
    return tensor


def _non_finite(which: str) -> Callable[[Stream, bool], str]:
    def spoil(weights: Stream, moe: bool) -> str:
        for index, (name, tensor) in enumerate(weights):
            kind = "scale" if "scale" in name else "weight"
            if kind != which or "input" in name:
                continue
            poisoned = _poisoned(tensor, name)
            if poisoned is not None:
                weights[index] = (name, poisoned)
                return name
        pytest.skip(f"no {which} of this format can hold a non-finite value")

    return spoil


SPOILS = {
    "sent-twice": _doubled,
    "oversized": _resized(2),
    "undersized": _resized(0.5),
    "non-finite-weight": _non_finite("weight"),
    "non-finite-scale": _non_finite("scale"),
}


@pytest.mark.parametrize("spoil", list(SPOILS))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_an_incomplete_or_bad_refit_is_refused_and_changes_nothing(
    request: pytest.FixtureRequest, fmt: str, spoil: str
) -> None:
    with format_started(request, fmt) as (case, model):
        good = case.checkpoint(1)
        refit_weights(model, list(good.items()))
        before = kernel_state(model)
        bad = list(case.checkpoint(2).items())
        SPOILS[spoil](bad, case.moe)
        with pytest.raises(RefitError) as caught:
            refit_weights(model, bad)
        assert caught.value.parameter is not None, caught.value
        assert caught.value.parameter in str(caught.value)
        if spoil == "sent-twice":
            assert "written twice" in str(caught.value), caught.value
        if spoil.startswith("non-finite"):
            assert "non-finite" in str(caught.value) or "NaN" in str(caught.value), caught.value
        assert_same_kernel_state(model, before)
        refit_weights(model, list(good.items()))  # and a good refit still goes through
        assert_same_kernel_state(model, before)  # the same weights: the same bytes


@pytest.mark.parametrize("how", ["argument", "environment", "context-manager"])
def test_non_finite_values_load_when_the_refit_opts_out(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """vLLM's behaviour on request: a NaN weight is loaded as sent."""
    with format_started(request, "fp8-linear") as (case, model):
        weights = list(case.checkpoint(1).items())
        name = _non_finite("weight")(weights, False)
        if how == "argument":
            refit_weights(model, weights, allow_non_finite=True)
        elif how == "environment":
            monkeypatch.setenv("PATCHKIT_REFIT_ALLOW_NON_FINITE", "1")
            refit_weights(model, weights)
        else:
            with refit(model, allow_non_finite=True):
                model.load_weights(iter(weights))
        assert name.startswith("gate.")
        served = model.gate_up.weight.detach()
        assert bool(torch.isnan(served.float()).any())
