"""``megatron.hybrid_optimizer_fp32_state``: ``HybridDeviceOptimizer(param_update_in_fp32=True)``
loads a state dict when some or all of its parameters are fp32.

Upstream's own optimizer class on CPU, loading the state dict a stepped optimizer saves
(``patches/megatron/optimizer/_checks/_hybrid_optimizer_load.py`` says why it is built, not stepped).
ROLL's ``patch_hybrid_optimizer`` (``mcore_adapter/src/mcore_adapter/patcher.py``) returns from
``_update_fp32_params_by_new_state`` when ``param_to_fp32_param`` is empty: with all parameters
fp32 nothing is copied and the state loads. The patch does that, and also serves a mix.
"""

from __future__ import annotations

import pytest
from doctor_verdicts import verdict_of
from patchkit.patches.megatron.optimizer._checks._hybrid_optimizer_load import ALL_BF16, ALL_FP32, MIXED, load

import patchkit
from patchkit.doctor import FAILED, VERIFIED

PATCH = "megatron.hybrid_optimizer_fp32_state"

pytestmark = pytest.mark.usefixtures("patches_restored")


@pytest.mark.parametrize("dtypes", [ALL_FP32, MIXED], ids=["all-fp32", "fp32-and-bf16"])
def test_upstream_load_raises_key_error_on_an_fp32_parameter(dtypes):
    outcome = load(dtypes)
    assert outcome.error is not None and outcome.error.startswith("KeyError: Parameter containing")


def test_upstream_loads_when_every_parameter_has_an_fp32_copy():
    """What the patch leaves to upstream: bf16 parameters only, each copy gets its master_param."""
    outcome = load(ALL_BF16)
    assert (outcome.error, outcome.state_loaded, outcome.fp32_copies_loaded) == (None, True, True)


def test_patched_load_with_fp32_parameters_is_rolls():
    """ROLL's fix: with no fp32 copy at all, nothing is copied and the optimizer state loads."""
    with patchkit.applied(PATCH) as (status,):
        assert status.to_dict()["state"] == "applied"
        outcome = load(ALL_FP32)
    assert outcome == type(outcome)(None, state_loaded=True, fp32_copies_loaded=True, fp32_params_untouched=True)


def test_patched_load_with_fp32_and_bf16_parameters_updates_the_bf16_copy():
    """Beyond ROLL's early return (which still raises here): the bf16 parameter's copy gets its master_param."""
    with patchkit.applied(PATCH):
        outcome = load(MIXED)
        unchanged = load(ALL_BF16)
    assert outcome == type(outcome)(None, state_loaded=True, fp32_copies_loaded=True, fp32_params_untouched=True)
    assert (unchanged.error, unchanged.state_loaded, unchanged.fp32_copies_loaded) == (None, True, True)


def test_check_is_verified():
    verdict = verdict_of(PATCH, applied=True)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("megatron.hybrid_optimizer_fp32_state")
def test_check_fails_with_upstreams_update_fp32_params_by_new_state():
    verdict = verdict_of(PATCH, applied=True, as_upstream=True)
    assert verdict.verdict == FAILED
    assert "all fp32 parameters: load_state_dict" in verdict.message and "KeyError" in verdict.message
