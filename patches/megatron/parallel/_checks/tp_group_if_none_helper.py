"""Self-check of ``megatron.tp_group_if_none_helper`` (native): megatron-core's own helper does the job."""

from __future__ import annotations

import warnings

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import megatron_on


def check_tp_group_if_none_helper(context: CheckContext) -> None:
    """Native: ``megatron.core.utils.get_tensor_model_parallel_group_if_none`` exists and, with Megatron's
    parallel state started, gives the tensor-parallel group for ``None`` (the expert one with
    ``is_expert=True``) and a given group back unchanged."""
    from megatron.core import parallel_state, utils

    helper = getattr(utils, "get_tensor_model_parallel_group_if_none", None)
    expect(callable(helper), "megatron.core.utils has get_tensor_model_parallel_group_if_none",
           "a function", type(helper).__name__)
    assert helper is not None
    with megatron_on(context.device), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # upstream's "passing tp_group will be mandatory"
        default = parallel_state.get_tensor_model_parallel_group()
        expert = parallel_state.get_expert_tensor_parallel_group()
        expect(helper(None) is default, "for None it gives the tensor-parallel group", default, helper(None))
        expect(helper(None, is_expert=True) is expert, "for None with is_expert=True it gives the expert "
               "tensor-parallel group", expert, helper(None, is_expert=True))
        given = object()
        expect(helper(given) is given, "a group given is returned unchanged", given, helper(given))
