"""Self-check of ``megatron.swiglu_singleton_local_shards`` (native): megatron-core's swiglu
sharded-state factory accepts ``singleton_local_shards``.
"""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect


def check_swiglu_singleton_local_shards(context: CheckContext) -> None:
    """Native: megatron-core's swiglu sharded-state factory accepts ``singleton_local_shards``."""
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    from patchkit.runtime.probing import accepts_parameter

    expect(accepts_parameter(apply_swiglu_sharded_factory, "singleton_local_shards"),
           "apply_swiglu_sharded_factory takes singleton_local_shards", "the parameter", "no such parameter")
