"""One rank of a 4-process gloo job with expert parallelism 4, for the expert-name tests.

Runs upstream's ``_megatron_local_name_to_global`` on this rank, before and after applying
``bridge.expert_local_to_global``, and writes what it returned to ``<out>/rank<r>.json``. Also:
with a model that carries its own EP group (``pg_collection.ep``: ranks {0, 1} and {2, 3}), which
Bridge 0.4.2+ reads through ``_get_ep_group``; the patch's wrap applied by hand over upstream's
function (what forcing it on 0.5+ would do); and ``PATCHKIT_FORCE`` on a native variant.

Ranks are started with the ``spawn`` method and :func:`run` loads the upstreams itself
(:func:`load_upstreams`). The earlier forkserver preload never ran: Python 3.12's forkserver receives
the parent's ``sys_path`` but does not apply it, so ``import ep_preload`` failed with
``ModuleNotFoundError``, which the forkserver swallows. Each rank then imported Bridge without ModelOpt's
Megatron plugin loaded first, and ModelOpt 0.44/0.47 met the TransformerEngine stub half-way through
registering its Megatron modules ("ColumnParallelLinear already registered!").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

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


def _forced(patch_id: str, names: Callable[[], dict[str, str]]) -> dict:
    """``PATCHKIT_FORCE`` on a native variant: strict mode raises, non-strict records the refusal and skips."""
    import patchkit

    os.environ["PATCHKIT_FORCE"] = patch_id
    try:
        with patchkit.applied(patch_id, strict=False) as records:
            result: dict = {"states": [[r.state.value, r.reason and r.reason.value, r.error] for r in records],
                            "names": names()}  # what the function gives while the refused force is in effect
        try:
            with patchkit.applied(patch_id, strict=True):
                result["strict"] = {"error": None}
        except Exception as exc:  # the refusal is what is recorded
            from patchkit.runtime.errors import ForceRefusedError

            result["strict"] = {"error": type(exc).__name__, "message": str(exc),
                                "refused": isinstance(exc, ForceRefusedError)}
        return result
    finally:
        del os.environ["PATCHKIT_FORCE"]


def load_upstreams() -> None:
    """What the Bridge conftest does, in this fresh interpreter: the harness on ``sys.path``, ModelOpt's
    Megatron plugin loaded first, then Bridge under the TE import stub. Errors propagate (no silent skip)."""
    import importlib.util
    import sys

    tests = str(Path(__file__).resolve().parents[1])
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from te_harness import bridge_import_context, load_modelopt_megatron_plugin

    if importlib.util.find_spec("modelopt") is not None:
        load_modelopt_megatron_plugin()
    with bridge_import_context():
        import megatron.bridge.models.conversion.model_bridge  # noqa: F401


def run(rank: int, world_size: int, out_dir: str, init_method: str) -> None:
    load_upstreams()
    import torch
    from _multiprocess import init_rank

    # A file rendezvous, not a TCP port picked by the parent: ranks load Bridge for seconds before they
    # bind, and a port found free then was taken by another job in between (EADDRINUSE).
    init_rank(rank, world_size, init_method)
    try:
        from megatron.bridge.models.conversion import model_bridge
        from megatron.core import parallel_state
        from megatron.core.transformer import TransformerConfig

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
        from patchkit.patches.bridge.qat import _expert_local_to_global

        twice = _expert_local_to_global.wrap_local_name_to_global(model_bridge._megatron_local_name_to_global)
        result["wrapped_over_upstream"] = _map_all(twice, config)
        result["forced"] = _forced("bridge.expert_local_to_global",
                                   lambda: _map_all(model_bridge._megatron_local_name_to_global, config))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        parallel_state.destroy_model_parallel()
    finally:
        torch.distributed.destroy_process_group()
