"""One rank of a 4-process gloo job with expert parallelism 4, for the expert-name tests.

Runs upstream's ``_megatron_local_name_to_global`` on this rank, before and after applying
``bridge.expert_local_to_global``, and writes what it returned to ``<out>/rank<r>.json``. Also:
with a model that carries its own EP group (``pg_collection.ep``: ranks {0, 1} and {2, 3}), which
Bridge 0.4.2+ reads through ``_get_ep_group``; the patch's wrap applied by hand over upstream's
function (what forcing it on 0.5+ would do); and ``PATCHKIT_FORCE`` on a native variant.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

NAMES = (
    "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
    "decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight0",
    "decoder.layers.1.mlp.experts.linear_fc2.weight1",
    "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight_quantizer._amax",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.mlp.router.weight",
)
GROUPED_QUANTIZER = "decoder.layers.0.mlp.experts.linear_fc1.weight_quantizer._amax"


def _map_all(function, config) -> dict[str, str]:
    out = {name: function(None, config, name) for name in NAMES}
    try:
        out[GROUPED_QUANTIZER] = function(None, config, GROUPED_QUANTIZER)
    except Exception as exc:  # upstream's failure is part of what is recorded
        out[GROUPED_QUANTIZER] = f"{type(exc).__name__}: {exc}"
    return out


def _model_with_ep_group(group):
    """What ``_get_ep_group`` reads: a model whose ``pg_collection.ep`` is ``group``."""
    import types

    return types.SimpleNamespace(pg_collection=types.SimpleNamespace(ep=group))


def _forced(patch_id: str) -> dict:
    import patchkit

    os.environ["PATCHKIT_FORCE"] = patch_id
    try:
        with patchkit.applied(patch_id) as records:
            return {"states": [(r.reason or r.state).value for r in records]}
    except Exception as exc:  # the refusal is what is recorded
        from patchkit.runtime.errors import PatchkitError

        return {"error": type(exc).__name__, "message": str(exc), "typed": isinstance(exc, PatchkitError)}
    finally:
        del os.environ["PATCHKIT_FORCE"]


def run(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import torch
    from te_stub import bridge_import_context

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from megatron.core import parallel_state
        from megatron.core.transformer import TransformerConfig

        with bridge_import_context():
            from megatron.bridge.models.conversion import model_bridge

        import patchkit

        parallel_state.initialize_model_parallel(expert_model_parallel_size=world_size)
        config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8)
        result = {"ep_rank": parallel_state.get_expert_model_parallel_rank()}
        result["upstream"] = _map_all(model_bridge._megatron_local_name_to_global, config)
        with patchkit.applied("bridge.expert_local_to_global") as records:
            result["states"] = [(r.reason or r.state).value for r in records]
            result["patched"] = _map_all(model_bridge._megatron_local_name_to_global, config)
            # Bridge 0.4.2+: the EP group comes from the model when it has one (groups of 2 ranks here).
            halves = [torch.distributed.new_group([0, 1]), torch.distributed.new_group([2, 3])]
            if hasattr(model_bridge, "_get_ep_group"):
                model = [_model_with_ep_group(halves[rank // 2])]
                result["model_group"] = {
                    name: model_bridge._megatron_local_name_to_global(model, config, name) for name in NAMES}
        if hasattr(model_bridge, "_get_ep_group"):
            result["model_group_upstream"] = {
                name: model_bridge._megatron_local_name_to_global(model, config, name) for name in NAMES}
        from patchkit.patches.bridge import _expert_names

        twice = _expert_names.wrap_local_name_to_global(model_bridge._megatron_local_name_to_global)
        result["wrapped_over_upstream"] = _map_all(twice, config)
        result["forced"] = _forced("bridge.expert_local_to_global")
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        parallel_state.destroy_model_parallel()
    finally:
        torch.distributed.destroy_process_group()
