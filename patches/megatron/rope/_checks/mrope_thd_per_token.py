"""Self-check of ``megatron.mrope_thd_per_token``: each CP rank's mRoPE q/k equal ROLL's rotation of its tokens."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import megatron_on

# Same rows, same formula: upstream's BSHD kernel and ROLL's written-out rotation agree to rounding.
TOLERANCE = 1e-5


def check_mrope_thd_per_token(context: CheckContext) -> None:
    """A tiny ``SelfAttention`` with mRoPE on three packed sequences (16, 8, 8; an image in the first).

    Split zig-zag over a CP group of 2, position ids with the tokens (ROLL's packing): each rank's
    rotated query and key must equal ROLL's rotation of its tokens' unrotated q/k by its tokens'
    table rows. Upstream reads the 16-row local table as positions and rotates by other rows.
    """
    from ._mrope_thd import CP_SIZE, build_attention, compare_with_roll

    with megatron_on(context.device):
        for outcome in compare_with_roll(build_attention(context.device), context.device):
            what = (f"mRoPE, CP rank {outcome.rank} of {CP_SIZE}: q/k equal ROLL's per-token rotation "
                    "(largest difference)")
            expect(outcome.error is None and outcome.max_difference is not None
                   and outcome.max_difference <= TOLERANCE, what, f"<= {TOLERANCE}",
                   outcome.error if outcome.error is not None else outcome.max_difference)
