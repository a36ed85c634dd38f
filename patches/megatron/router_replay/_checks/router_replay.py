"""Self-check of ``megatron.router_replay``: Record, then replay through FP8-padded THD packing.
"""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import drive, moe_replay, replay_routers


def check_router_replay(context: CheckContext) -> None:
    """Record, then replay through FP8-padded THD packing: routing equals the record; another target is followed.

    Three packed samples (5, 11, 3 tokens) padded for FP8 to 128 slots. The recorded indices go
    through ``unpack`` (per-sample, padding dropped) and ``pack`` back; the expert bias is shifted so
    that the router alone would choose other experts; the replayed routing map must equal the
    recorded one at every token. Then a target of different experts (each recorded expert + 1) must
    be what the routers route to.
    """
    import types

    from ... import router_replay as replay
    from ..._checks._tiny_moe import (
        NUM_EXPERTS,
        RoutingCapture,
        build_tiny_moe,
        forward_loss,
        shift_expert_bias,
        thd_batch,
    )

    lengths, seq_len = [5, 11, 3], 12
    layout = replay.thd_layout(lengths, seq_len=seq_len,
                               config=types.SimpleNamespace(fp8="e4m3", tensor_model_parallel_size=1))
    expect(layout.total_tokens == 128, "FP8 padding packs 5+11+3 tokens into 128 slots", 128, layout.total_tokens)
    with moe_replay(context.device), torch.no_grad():
        model = build_tiny_moe(max_sequence_length=128).to(context.device)
        model_routers = replay_routers(model)
        per_sample_ids = torch.randint(1, 128, (3, seq_len), generator=torch.Generator().manual_seed(1))
        batch = thd_batch(layout, per_sample_ids).to(context.device)
        capture = RoutingCapture(model)
        try:
            drive(model_routers, "record")
            forward_loss(model, batch)
            recorded_maps = [m.cpu() for m in capture.take()]
            recorded = [r.get_recorded_indices() for r in model_routers]
            expect(all(r is not None for r in recorded), "a RECORD pass stores every layer's top-k indices",
                   f"{len(model_routers)} recorded tensors", f"{sum(r is not None for r in recorded)}")
            per_sample = replay.unpack(torch.stack([r.cpu() for r in recorded], dim=1), layout)
            packed = replay.pack(per_sample, layout)

            valid = torch.zeros(layout.total_tokens, dtype=torch.bool)
            cells = torch.arange(seq_len) < torch.tensor(lengths)[:, None]
            valid[layout.slot_of_cell.view(3, seq_len)[cells]] = True

            shift_expert_bias(model)
            forward_loss(model, batch)  # no action: what the shifted router chooses on its own
            unreplayed = [m.cpu() for m in capture.take()]
            expect(any(not torch.equal(u[valid], r[valid]) for u, r in zip(unreplayed, recorded_maps, strict=True)),
                   "shifting the expert bias changes the routing without replay (else replay is not tested)",
                   "a different routing", "the recorded routing")

            drive(model_routers, "replay_forward", list(packed.unbind(1)))
            forward_loss(model, batch)
            replayed = [m.cpu() for m in capture.take()]
            mismatched = sum(int((rep[valid] != rec[valid]).any(-1).sum())
                             for rep, rec in zip(replayed, recorded_maps, strict=True))
            expect(mismatched == 0, "REPLAY_FORWARD of the packed record routes every token as recorded "
                   "(tokens routed differently)", 0, mismatched)

            other = [(t + 1) % NUM_EXPERTS for t in packed.unbind(1)]
            drive(model_routers, "replay_forward", other)
            forward_loss(model, batch)
            followed = [m.cpu() for m in capture.take()]
            wanted = [torch.zeros_like(m).scatter_(1, t.long(), True) for m, t in zip(followed, other, strict=True)]
            off = sum(int((f[valid] != w[valid]).any(-1).sum()) for f, w in zip(followed, wanted, strict=True))
            expect(off == 0, "REPLAY_FORWARD of a different target routes to the target's experts "
                   "(tokens routed elsewhere)", 0, off)
        finally:
            capture.remove()
            drive(model_routers, None)
