"""Self-check of ``bridge.expert_local_to_global``: On EP rank 3 of 4 (8 experts), local expert 1 is exported
as global expert 7 in both namings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from patchkit.selfcheck import CheckContext, expect

NUM_EXPERTS = 8

EP_SIZE, EP_RANK = 4, 3


class _ExpertGroup:
    """An expert-parallel group as seen from one rank: all Bridge's renumbering reads of it."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@contextlib.contextmanager
def _on_expert_rank(size: int, rank: int) -> Iterator[None]:
    """Bridge's and megatron-core's EP-group lookups answer ``rank`` of ``size`` (one process stands in).

    Renumbering is arithmetic on the group's size and rank; running ``size`` processes would test the
    same arithmetic at many times the cost (tests/bridge does that once, with four gloo ranks).
    """
    from megatron.bridge.models.conversion import model_bridge
    from megatron.core import parallel_state

    group = _ExpertGroup(size, rank)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(parallel_state, "get_expert_model_parallel_group",
                                              lambda *a, **k: group))
        for name, value in (("get_expert_model_parallel_world_size", size), ("get_expert_model_parallel_rank", rank)):
            stack.enter_context(mock.patch.object(parallel_state, name, lambda *a, _v=value, **k: _v))
        if hasattr(model_bridge, "_get_ep_group"):  # 0.4.2+: the group comes from the model
            stack.enter_context(mock.patch.object(model_bridge, "_get_ep_group", lambda *a, **k: group))
        yield


def check_expert_local_to_global(context: CheckContext) -> None:
    """On EP rank 3 of 4 (8 experts), local expert 1 is exported as global expert 7 in both namings."""
    import types

    from megatron.bridge.models.conversion import model_bridge
    from patchkit.patches.megatron._checks._harness import megatron_on

    config = types.SimpleNamespace(num_moe_experts=NUM_EXPERTS)
    per_rank = NUM_EXPERTS // EP_SIZE
    names = {
        "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight":
            f"decoder.layers.0.mlp.experts.local_experts.{per_rank * EP_RANK + 1}.linear_fc1.weight",
        "decoder.layers.0.mlp.experts.linear_fc1.weight1":
            f"decoder.layers.0.mlp.experts.linear_fc1.weight{per_rank * EP_RANK + 1}",
        "decoder.layers.0.self_attention.linear_qkv.weight": "decoder.layers.0.self_attention.linear_qkv.weight",
    }
    with megatron_on(context.device), _on_expert_rank(EP_SIZE, EP_RANK):
        found = {local: model_bridge._megatron_local_name_to_global([], config, local) for local in names}
    wrong = {local: found[local] for local in names if found[local] != names[local]}
    expect(not wrong, f"_megatron_local_name_to_global on EP rank {EP_RANK} of {EP_SIZE} ({NUM_EXPERTS} experts)",
           {local: names[local] for local in wrong}, wrong)
