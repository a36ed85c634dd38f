"""Self-check of ``modelopt.max_calibrator_nan_safe``: ModelOpt's ``MaxCalibrator`` collects an input
with NaN and inf, as a dummy-weight calibration produces, and keeps the amax of its finite values.
"""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect


def dummy_activations() -> torch.Tensor:
    """Two rows of a dummy-weight activation: one overflowed to NaN and +/-inf, one finite up to 3."""
    return torch.tensor([[float("nan"), float("inf"), -float("inf"), 1.0], [0.5, -3.0, 2.0, 0.0]])


def collect_amax(x: torch.Tensor, axis: Any = None) -> tuple[BaseException | None, torch.Tensor | None]:
    """Feed ``x`` to a fresh ModelOpt ``MaxCalibrator`` (8 bits, ``axis``): (the error, the amax)."""
    from modelopt.torch.quantization.calib.max import MaxCalibrator

    calibrator = MaxCalibrator(num_bits=8, axis=axis, unsigned=False)
    try:
        calibrator.collect(x)
    except (AssertionError, RuntimeError) as exc:  # upstream's assertion is the finding
        return exc, None
    return None, calibrator.compute_amax()


def check_max_calibrator_nan_safe(context: CheckContext) -> None:
    """``MaxCalibrator.collect`` takes NaN and inf inputs and keeps the finite values' amax."""
    error, amax = collect_amax(dummy_activations())
    expect(error is None, "MaxCalibrator.collect on an input with NaN and inf", "no error",
           f"{type(error).__name__}: {error}" if error is not None else None)
    found = None if amax is None else float(amax)
    expect(found == 3.0, "its amax (the finite values' largest magnitude, 3)", "3.0", found)
    error, amax = collect_amax(torch.full((2, 4), float("nan")), axis=0)
    found_rows = None if amax is None else amax.flatten().tolist()
    expect(error is None and found_rows == [0.0, 0.0], "per-row amax of an all-NaN input", "[0.0, 0.0]",
           found_rows if error is None else f"{type(error).__name__}: {error}")
