"""``megatron.swiglu_singleton_local_shards`` is declared native: check the claim on the installed core."""

from __future__ import annotations

from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

import patchkit
from patchkit.runtime.probing import accepts_parameter


def test_native_claim_holds_for_installed_megatron_core():
    with patchkit.applied("megatron.swiglu_singleton_local_shards") as (record,):
        assert (record.state.value, record.reason.value) == ("skipped", "native")
    assert accepts_parameter(apply_swiglu_sharded_factory, "singleton_local_shards")
