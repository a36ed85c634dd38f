"""megatron.routing_replay_keyword: ``TransformerConfig(enable_routing_replay=...)`` on every release.

0.16-0.19 pass it on as the ``moe_enable_routing_replay`` field; 0.14/0.15 (no field) set it on the
config object for patchkit's replay backport. A model built from such a config has replay state in
every router (upstream's native replay from 0.16, the backport on 0.14/0.15).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle

import pytest
from patchkit.patches.megatron.router_replay._routing_replay_keyword.alias import RoutingReplayKeywordConflict
from replay_models import REPLAY_PATCH_IDS, megatron_version, routers

import patchkit

PATCH = "megatron.routing_replay_keyword"
BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
            use_cpu_initialization=True, add_bias_linear=False)


@pytest.fixture
def keyword():
    with patchkit.applied(PATCH) as (status,):
        yield status


def _config_classes():
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    return {"TransformerConfig": (TransformerConfig, {}),
            "MLATransformerConfig": (MLATransformerConfig, {"kv_lora_rank": 16, "qk_head_dim": 8, "v_head_dim": 8,
                                                            "qk_pos_emb_head_dim": 8, "q_lora_rank": 16})}


def test_variant_for_this_release(keyword):
    record = keyword.to_dict()
    assert record["state"] == "applied"
    assert record["variant"] == ("attribute-after-init" if megatron_version() < (0, 16) else "field-keyword")


@pytest.mark.parametrize("name", ["TransformerConfig", "MLATransformerConfig"])
@pytest.mark.parametrize("value", [True, False])
def test_keyword_sets_the_replay_switch(keyword, name, value):
    cls, extra = _config_classes()[name]
    config = cls(**BASE, **extra, enable_routing_replay=value)
    assert config.moe_enable_routing_replay is value
    assert config.enable_routing_replay is value


def test_keyword_equals_the_field_on_016_and_later(keyword):
    if megatron_version() < (0, 16):
        pytest.skip("0.14/0.15 have no moe_enable_routing_replay field")
    from megatron.core.transformer.transformer_config import TransformerConfig

    def plain_fields(config):  # init methods are fresh functools.partial objects per config
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                if not callable(getattr(config, f.name))}

    by_keyword = TransformerConfig(**BASE, enable_routing_replay=True)
    by_field = TransformerConfig(**BASE, moe_enable_routing_replay=True)
    assert plain_fields(by_keyword) == plain_fields(by_field)


def test_without_the_keyword_configs_are_upstreams(keyword):
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(**BASE)
    assert config.enable_routing_replay is False
    if megatron_version() >= (0, 16):
        assert config.moe_enable_routing_replay is False
    else:
        assert "moe_enable_routing_replay" not in vars(config)


def test_dataclass_shape_is_kept(keyword):
    """No new field; asdict, replace, copy, pickle, the MindSpeed-visible signature."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    assert "enable_routing_replay" not in {f.name for f in dataclasses.fields(TransformerConfig)}
    config = TransformerConfig(**BASE, enable_routing_replay=True)
    assert "enable_routing_replay" not in dataclasses.asdict(config)
    assert pickle.loads(pickle.dumps(config)).enable_routing_replay is True
    assert copy.deepcopy(config).moe_enable_routing_replay is True
    replaced = dataclasses.replace(config, num_layers=4)
    assert replaced.num_layers == 4
    parameter = inspect.signature(TransformerConfig.__init__).parameters["enable_routing_replay"]
    assert (parameter.kind, parameter.default) == (inspect.Parameter.KEYWORD_ONLY, False)
    assert "num_layers" in inspect.signature(TransformerConfig.__init__).parameters


def test_the_signature_with_the_keyword_is_worked_out_when_first_read_not_at_install(keyword):
    """``TransformerConfig.__init__`` has hundreds of parameters: its signature costs milliseconds."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    signature = TransformerConfig.__init__.__signature__
    assert isinstance(signature, inspect.Signature) and signature._made is None
    assert "enable_routing_replay" in inspect.signature(TransformerConfig).parameters
    assert signature._made is not None and str(signature) == str(signature._made)


def test_setting_the_alias_sets_the_field(keyword):
    """verl's own patch and its engine set ``config.enable_routing_replay = True`` after construction."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(**BASE)
    config.enable_routing_replay = True
    assert config.moe_enable_routing_replay is True


def test_contradicting_pair_raises_and_builds_nothing(keyword):
    if megatron_version() < (0, 16):
        pytest.skip("0.14/0.15 refuse moe_enable_routing_replay as a keyword themselves (no such field)")
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs = dict(BASE, enable_routing_replay=True, moe_enable_routing_replay=False)
    with pytest.raises(RoutingReplayKeywordConflict) as caught:
        TransformerConfig(**kwargs)
    assert (caught.value.keyword, caught.value.field) == (True, False)
    assert isinstance(caught.value, ValueError)
    agreeing = TransformerConfig(**dict(BASE, enable_routing_replay=True, moe_enable_routing_replay=True))
    assert agreeing.moe_enable_routing_replay is True


def test_model_from_the_keyword_gets_replay_state_in_every_router(megatron_cpu):
    """End to end: the routers of a MoE GPT built from ``enable_routing_replay=True`` can record."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    from moe_harness import cpu_moe
    from patchkit.patches.megatron import router_replay as replay

    with cpu_moe(), patchkit.applied(PATCH, *REPLAY_PATCH_IDS):
        replay.reset()
        try:
            config = TransformerConfig(**dict(BASE, ffn_hidden_size=32,
                                              params_dtype=torch.float32), enable_routing_replay=True)
            model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(num_experts=8),
                             vocab_size=128, max_sequence_length=16)
            assert all(getattr(r, "router_replay", None) is not None for r in routers(model))
            assert len(routers(model)) == 2
        finally:
            replay.reset()


def test_revert_restores_upstreams_init_and_removes_the_alias():
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    inits = TransformerConfig.__init__, MLATransformerConfig.__init__
    with patchkit.applied(PATCH):
        pass
    assert (TransformerConfig.__init__, MLATransformerConfig.__init__) == inits
    assert not hasattr(TransformerConfig, "enable_routing_replay")
    with pytest.raises(TypeError, match="enable_routing_replay"):
        TransformerConfig(**BASE, enable_routing_replay=True)
