"""Self-check of ``megatron.hybrid_optimizer_fp32_state``: a state dict loads with fp32 parameters present."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect


def check_hybrid_optimizer_fp32_state(context: CheckContext) -> None:
    """Upstream's ``HybridDeviceOptimizer`` (``param_update_in_fp32=True``) loads a trained state dict.

    Two fp32 parameters (the distributed optimizer's case), then one fp32 and one bf16: the
    optimizer state must arrive, the bf16 parameter's fp32 copy must hold the loaded master_param
    and the fp32 parameter must be left as it was. Upstream raises KeyError on the fp32 parameter.
    """
    from ._hybrid_optimizer_load import ALL_FP32, MIXED, load

    for name, dtypes in (("all fp32", ALL_FP32), ("fp32 and bf16", MIXED)):
        outcome = load(dtypes, context.device)
        expect(outcome.error is None, f"{name} parameters: load_state_dict", "no error", outcome.error)
        expect(outcome.state_loaded and outcome.fp32_copies_loaded and outcome.fp32_params_untouched,
               f"{name} parameters: loaded state, fp32 copies and untouched fp32 parameters",
               (True, True, True),
               (outcome.state_loaded, outcome.fp32_copies_loaded, outcome.fp32_params_untouched))
