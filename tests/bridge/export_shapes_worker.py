"""One rank of a 2-process gloo job with tensor or pipeline parallelism 2, for the ``export_shapes`` tests.

With tensor parallelism, both ranks run Bridge's own ``export_hf_weights`` (the real TP gathers: the
upstream truth), then each rank in turn runs ``export_shapes`` **alone** while its peer waits at a
barrier, so nothing the run does can depend on the peer. Every call of a collective is counted, at the
``torch.distributed`` attribute Bridge calls and at ``distributed_c10d``'s own function, with the size
of its group (the same counter sees Bridge's own export gather over the TP group: the control); and the
devices of every tensor Bridge's mappings return during the run are recorded. (A c10d gather of meta
tensors never reaches gloo: torch runs its meta kernel. The count is what shows that Bridge's gathers
are not even called.) With pipeline parallelism the stages run ``export_shapes`` together: each learns
the shapes of the other's tensors through Bridge's ``all_gather_object`` records, and no tensor crosses.
"""

from __future__ import annotations

import datetime
import functools
from pathlib import Path
from typing import Any

#: A rank whose peer died fails this soon in its next collective, well within the job's deadline.
IDLE_PEER_TIMEOUT = datetime.timedelta(seconds=90)
COLLECTIVES = ("all_gather", "all_gather_into_tensor", "broadcast", "scatter", "all_reduce", "reduce_scatter_tensor",
               "all_gather_object", "broadcast_object_list", "barrier")
OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list")


def _count_collectives(calls: list[tuple[str, int]]) -> list[tuple[Any, str, Any]]:
    """Wrap every collective (package attribute and c10d function) to append (name, group size) to ``calls``."""
    import torch.distributed
    from torch.distributed import distributed_c10d

    saved = []
    inside: list[str] = []  # the object collective running: the tensor collectives it makes are its own

    for module in (torch.distributed, distributed_c10d):
        for name in COLLECTIVES:
            original = getattr(module, name, None)
            if original is None:
                continue

            def counted(*args: Any, __name: str = name, __original: Any = original, **kwargs: Any) -> Any:
                if not inside:
                    calls.append((__name, torch.distributed.get_world_size(kwargs.get("group"))))
                is_object = __name in OBJECT_COLLECTIVES
                if is_object:
                    inside.append(__name)
                try:
                    return __original(*args, **kwargs)
                finally:
                    if is_object:
                        inside.pop()

            saved.append((module, name, original))
            setattr(module, name, functools.wraps(original)(counted))
    return saved


def _spy_on_mappings(tasks: list[Any], devices: set[str]) -> None:
    """Record the device of every tensor each task's mapping returns (instance attribute, this job only)."""
    import torch

    for mapping in {id(task.mapping): task.mapping for task in tasks if task is not None}.values():
        def megatron_to_hf(*args: Any, __original: Any = mapping.megatron_to_hf, **kwargs: Any) -> Any:
            converted = __original(*args, **kwargs)
            devices.update(str(t.device) for t in converted.values() if isinstance(t, torch.Tensor))
            return converted

        mapping.megatron_to_hf = megatron_to_hf


def run(rank: int, world_size: int, folder: str, init_method: str, parallelism: str = "tensor") -> dict[str, Any]:
    """This rank's results; ``parallelism``: ``"tensor"`` (TP=world, each rank alone) or ``"pipeline"``
    (PP=world: the stages run ``export_shapes`` together, exchanging Bridge's shape records)."""
    from ep_worker import load_upstreams

    load_upstreams()
    import torch
    from _multiprocess import init_rank
    from export_shapes_model import as_rows, build, conversion_tasks, upstream_export
    from megatron.core import parallel_state
    from patchkit.patches.bridge.export import export_shapes
    from patchkit.patches.megatron._checks._cpu_stand_in import cpu_megatron

    init_rank(rank, world_size, init_method, timeout=IDLE_PEER_TIMEOUT)
    try:
        with cpu_megatron():
            from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

            pipeline = parallelism == "pipeline"
            tp, pp = (1, world_size) if pipeline else (world_size, 1)
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
            model_parallel_cuda_manual_seed(1234)
            bridge, model = build(Path(folder), tensor_parallel=tp, pipeline_parallel=pp)
            result: dict[str, Any] = {"local_shapes": {n: tuple(p.shape) for n, p in model[0].named_parameters()}}
            calls: list[tuple[str, int]] = []
            saved = _count_collectives(calls)  # the counter sees Bridge's own gathers (the control)
            try:
                result["upstream"] = upstream_export(bridge, model)
            finally:
                for module, name, original in saved:
                    setattr(module, name, original)
            result["upstream_calls"] = calls
            tasks = conversion_tasks(bridge, model)
            originals = {name: getattr(torch.distributed, name) for name in COLLECTIVES} | {"empty": torch.empty}
            devices: set[str] = set()
            _spy_on_mappings(tasks, devices)
            for alone in range(world_size):
                torch.distributed.barrier()
                if rank != alone and not pipeline:
                    continue
                if pipeline and alone > 0:
                    break
                calls: list[tuple[str, int]] = []
                saved = _count_collectives(calls)
                try:
                    result["shapes"] = as_rows(export_shapes(bridge, model, conversion_tasks=tasks))
                finally:
                    for module, name, original in saved:
                        setattr(module, name, original)
                result["calls"] = calls
            torch.distributed.barrier()
            result["devices"] = sorted(devices)
            result["tasks_still_real"] = all(t.param_weight.device.type == "cpu" for t in tasks
                                             if t is not None and t.param_weight is not None)
            result["left_wrapped"] = [name for name, fn in originals.items()
                                  if (torch.empty if name == "empty" else getattr(torch.distributed, name)) is not fn]
            parallel_state.destroy_model_parallel()
        return result
    finally:
        torch.distributed.destroy_process_group()
