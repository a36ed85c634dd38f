"""Self-check of ``megatron.mtp_router_slots``: MTP routers log after the decoder's layers.
"""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import moe_replay


def check_mtp_router_slots(context: CheckContext) -> None:
    """MTP routers log after the decoder's layers; forced tracker entries and replay numbers agree.

    A 2-layer MoE GPT with 2 MoE MTP depths: one training step must leave every router's
    load-balancing and z-loss in its own slot (decoder 1-2, MTP 3-4, none empty); a forced tracker
    entry must be sized 4 like the routers' own; where the replay state carries a ``layer_number``
    (0.19+), the MTP routers' must be 3 and 4.
    """
    from ..._checks._tiny_moe import build_tiny_moe, causal_batch
    from ._mtp_router_probe import AUX_LOSS_CONFIG, forced_entry_sizes, logged_layer_losses, replay_layer_numbers

    with moe_replay(context.device):
        model = build_tiny_moe(mtp_num_layers=2, mtp_loss_scaling_factor=0.1, **AUX_LOSS_CONFIG).to(context.device)
        for name, values in logged_layer_losses(model, causal_batch().to(context.device)).items():
            empty = [slot + 1 for slot, value in enumerate(values.tolist()) if value == 0.0]
            expect(len(values) == 4 and not empty, f"every router logs its {name} in its own slot "
                   "(decoder 1-2, MTP 3-4): empty slots", [], empty if len(values) == 4 else f"{len(values)} slots")
        sizes = forced_entry_sizes(num_layers=2, mtp_num_layers=2)
        expect(set(sizes.values()) == {4}, "track_moe_metrics(force_initialize=True) sizes entries for the "
               "decoder and the MTP layers", 4, sizes)
        numbers = {name: number for name, number in replay_layer_numbers(model).items() if name.startswith("mtp.")}
        if numbers:
            expect(sorted(numbers.values()) == [3, 4], "the MTP routers' replay states are numbered after "
                   "the decoder's layers", [3, 4], sorted(numbers.values()))
