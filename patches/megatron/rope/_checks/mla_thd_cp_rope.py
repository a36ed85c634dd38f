"""Self-check of ``megatron.mla_thd_cp_rope``: MLA's q/k per CP rank equal the unsplit packed batch's."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import megatron_on

# Same layer, same tokens: the rows differ only by float reassociation in the linear layers.
TOLERANCE = 1e-5


def check_mla_thd_cp_rope(context: CheckContext) -> None:
    """A tiny MLA (plain and YaRN RoPE) whose config says ``context_parallel_size=1``, run on a CP group of 2.

    Three packed sequences (16, 4, 4 tokens) split zig-zag over the two ranks: each rank's query
    and key must equal the rows of its tokens computed on the whole batch with CP=1. Upstream cuts
    the RoPE table to the 12 local tokens and fails on the 16-token sequence.
    """
    from ._mla_thd_cp import CP_SIZE, build_mla, compare_cp_ranks

    with megatron_on(context.device):
        for rope_type in ("rope", "yarn"):
            for outcome in compare_cp_ranks(build_mla(rope_type, config_cp_size=1, device=context.device),
                                            context.device):
                what = (f"{rope_type} RoPE, CP rank {outcome.rank} of {CP_SIZE}: q/k equal the CP=1 rows of "
                        "its tokens (largest difference)")
                expect(outcome.error is None and outcome.max_difference is not None
                       and outcome.max_difference <= TOLERANCE, what, f"<= {TOLERANCE}",
                       outcome.error if outcome.error is not None else outcome.max_difference)
