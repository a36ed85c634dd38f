"""Self-check of ``megatron.routing_replay_keyword``: ``TransformerConfig(enable_routing_replay=True)`` builds,
sets ``moe_enable_routing_replay``, shows the keyword in the signature, keeps upstream's dataclass fields,
and refuses a contradicting pair.
"""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

from ..._checks._harness import first_line

_MOE_CONFIG = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
                   use_cpu_initialization=True, add_bias_linear=False)


def check_routing_replay_keyword(context: CheckContext) -> None:
    """``TransformerConfig(enable_routing_replay=True)`` builds, sets ``moe_enable_routing_replay``, shows
    the keyword in the signature, keeps upstream's dataclass fields, and refuses a contradicting pair."""
    import dataclasses
    import inspect

    from megatron.core.transformer.transformer_config import TransformerConfig

    from .._routing_replay_keyword.alias import RoutingReplayKeywordConflict

    try:
        config = TransformerConfig(**_MOE_CONFIG, enable_routing_replay=True)
    except TypeError as exc:
        raise SelfCheckFailed("TransformerConfig accepts enable_routing_replay=True", "a config",
                              first_line(exc)) from exc
    expect(getattr(config, "moe_enable_routing_replay", None) is True,
           "enable_routing_replay=True sets moe_enable_routing_replay", True,
           getattr(config, "moe_enable_routing_replay", "no such attribute"))
    expect(getattr(config, "enable_routing_replay", None) is True, "config.enable_routing_replay reads the switch",
           True, getattr(config, "enable_routing_replay", "no such attribute"))
    expect("enable_routing_replay" in inspect.signature(TransformerConfig.__init__).parameters,
           "TransformerConfig.__init__'s signature names enable_routing_replay", "the parameter", "none")
    names = [f.name for f in dataclasses.fields(TransformerConfig)]
    expect("enable_routing_replay" not in names, "upstream's dataclass fields are unchanged (no new field)",
           "no enable_routing_replay field", "a field")
    try:
        TransformerConfig(**_MOE_CONFIG, enable_routing_replay=True, moe_enable_routing_replay=False)
    except RoutingReplayKeywordConflict:
        pass
    except Exception as exc:
        raise SelfCheckFailed("enable_routing_replay=True with moe_enable_routing_replay=False raises",
                              "RoutingReplayKeywordConflict", first_line(exc)) from exc
    else:
        raise SelfCheckFailed("enable_routing_replay=True with moe_enable_routing_replay=False raises",
                              "RoutingReplayKeywordConflict", "a config")
