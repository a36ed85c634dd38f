"""ModelOpt's ``MaxCalibrator.collect`` zero-fills non-finite inputs instead of asserting.

Declaration module (data only; see docs/writing-patches.md). A vLLM rollout worker that fake-quantizes
with ModelOpt calibrates right after start-up, on its dummy weights (``mtq.quantize`` with a forward
loop of ``_dummy_run``); the real weights and amax values only arrive later, by refit. Deep BF16
matmuls on dummy weights can overflow to inf/NaN, and ``MaxCalibrator.collect`` then fails its
``assert not torch.any(torch.isnan(local_amax))`` (or the inf one), which aborts the worker. The
dummy amax is thrown away anyway (NeMo-RL sets every enabled quantizer's amax to -1 afterwards), so
NeMo-RL (``vllm_quant_patch.py``, ``_tolerate_dummy_weight_nan_amax``) wraps ``collect`` for the
dummy calibration: a non-finite input goes through ``torch.nan_to_num(x, nan=0, posinf=0,
neginf=0)`` first. The patch is that wrapper.

Opt-in, and meant to be scoped: it silences exactly the assertion that catches a genuine NaN in a
real calibration, so apply it around the dummy calibration only
(``with patchkit.applied("modelopt.max_calibrator_nan_safe"): mtq.quantize(...)``).

Ranges, from the wheels: ``MaxCalibrator.collect`` (``modelopt/torch/quantization/calib/max.py``) is
the same code in 0.43.0, 0.44.0, 0.47.0 and 0.48.0rc1. Tests ran on each of them.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

MAX_CALIB = "modelopt.torch.quantization.calib.max"

PATCHES = (
    Patch(
        id="modelopt.max_calibrator_nan_safe",
        self_check="._checks.max_calibrator_nan_safe:check_max_calibrator_nan_safe",
        summary=(
            "MaxCalibrator.collect zero-fills NaN and +/-inf inputs instead of asserting (dummy-weight calibration)."
        ),
        why=(
            "A vLLM rollout worker calibrates ModelOpt fake quantization on its dummy start-up weights, whose "
            "activations can overflow; collect then asserts on the NaN amax and the worker dies, although that "
            "amax is discarded before refit (NeMo-RL wraps collect in vllm_quant_patch.py for this)."
        ),
        upstream=(
            "https://github.com/NVIDIA/Model-Optimizer/blob/0.47.0/modelopt/torch/quantization/calib/max.py"
        ),
        removal="Remove once ModelOpt's MaxCalibrator can skip or zero non-finite calibration inputs.",
        version_modules={"nvidia-modelopt": "modelopt"},
        opt_in=True,
        variants=(
            Variant(
                requires={"nvidia-modelopt": ">=0.43,<0.49"},
                installs=(Wrap(f"{MAX_CALIB}:MaxCalibrator.collect", "._max_calibrator_nan_safe:wrap_collect"),),
                label="zero-fill-nonfinite",
            ),
        ),
    ),
)
