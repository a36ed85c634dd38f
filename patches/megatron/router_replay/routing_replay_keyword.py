"""``TransformerConfig(enable_routing_replay=...)``: the keyword older RL frameworks pass, mapped.

Declaration module. megatron-core 0.16 added router replay under the field name
``moe_enable_routing_replay``; no release has ``enable_routing_replay``, the name verl's (and
slime's) own replay used and their trainers still pass. On 0.16-0.19 the keyword becomes the field
keyword before the dataclass ``__init__`` (so ``__post_init__`` validates it); on 0.14/0.15, which
have no field, it is set on the config object after ``__init__``, where ``megatron.router_replay``'s
backport reads it. Both expose ``config.enable_routing_replay`` as an alias of the field.
"""

from __future__ import annotations

from patchkit import Add, Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_CONFIG = "megatron.core.transformer.transformer_config"
_ALIAS = f"{_CONFIG}:TransformerConfig.enable_routing_replay"

PATCHES = (
    Patch(
        id="megatron.routing_replay_keyword",
        self_check="._checks.routing_replay_keyword:check_routing_replay_keyword",
        summary=(
            "TransformerConfig and MLATransformerConfig accept enable_routing_replay=..., mapped to "
            "moe_enable_routing_replay; config.enable_routing_replay reads and writes that field."
        ),
        why=(
            "Frameworks written against their own replay patch (verl's router_replay_patch, slime) "
            "pass enable_routing_replay; every megatron-core raises TypeError on it, and verl patches "
            "TransformerConfig.__init__ (and its __signature__, for MindSpeed) to strip it."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_r0.16.0/"
            "megatron/core/transformer/transformer_config.py"
        ),
        removal="Remove when the frameworks pass moe_enable_routing_replay (upstream keeps only that name).",
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="attribute-after-init",
                requires={"megatron-core": ">=0.14,<0.16"},
                installs=(
                    Wrap(f"{_CONFIG}:TransformerConfig.__init__", "._routing_replay_keyword.v014:wrap_init"),
                    Wrap(f"{_CONFIG}:MLATransformerConfig.__init__", "._routing_replay_keyword.v014:wrap_init"),
                    Add(_ALIAS, "._routing_replay_keyword.alias:ENABLE_ROUTING_REPLAY"),
                ),
            ),
            Variant(
                label="field-keyword",
                requires={"megatron-core": ">=0.16,<0.20"},
                installs=(
                    Wrap(f"{_CONFIG}:TransformerConfig.__init__", "._routing_replay_keyword.v016:wrap_init"),
                    Wrap(f"{_CONFIG}:MLATransformerConfig.__init__", "._routing_replay_keyword.v016:wrap_init"),
                    Add(_ALIAS, "._routing_replay_keyword.alias:ENABLE_ROUTING_REPLAY"),
                ),
            ),
        ),
    ),
)
