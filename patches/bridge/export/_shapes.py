"""``export_shapes``: what ``AutoBridge.export_hf_weights`` would yield, as (name, shape, dtype), for free.

A refit planner (NeMo-RL's ``megatron_policy_worker.py``, before building its transfer plan) needs the
name, full shape and dtype of every Hugging Face tensor Bridge's export yields, in its order, but not the
tensors: gathering them costs the TP/EP all-gathers and PP broadcasts of the whole model and a full copy of
each weight. This runs Bridge's own export on copies of its conversion tasks whose parameters are ``meta``
tensors (same shape, dtype and tensor-parallel attributes), inside :func:`._shape_only.shape_only` for each
step of Bridge's generator: every tensor Bridge derives is meta, its tensor collectives do nothing, and
the caller's code between two steps runs with torch untouched.

Read against Bridge 0.2.0rc6, 0.3.1 and 0.6.2 (``auto_bridge.py:export_hf_weights``,
``model_bridge.py:stream_weights_megatron_to_hf``, ``param_mapping.py``): every release takes
``conversion_tasks``, iterates them in order, and gathers through ``gather_from_tp_ranks`` /
``gather_from_ep_ranks`` (``torch.empty_like`` then ``torch.distributed.all_gather``) and
``broadcast_from_pp_rank`` (``all_gather_object`` of the specs, ``torch.empty``, ``torch.distributed.broadcast``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch

from ._shape_only import shape_only


class ExportedShape(NamedTuple):
    """One Hugging Face tensor of the export: its name, full (unsharded) shape and dtype."""

    name: str
    shape: torch.Size
    dtype: torch.dtype


def export_shapes(bridge: Any, model: Any, conversion_tasks: Sequence[Any] | None = None) -> Iterator[ExportedShape]:
    """Yield ``(name, shape, dtype)`` of each tensor ``bridge.export_hf_weights(model)`` yields, in its order.

    ``bridge`` is a Megatron-Bridge ``AutoBridge``; ``model`` a Megatron model or its list of chunks.
    ``conversion_tasks``: Bridge's tasks (``bridge.get_conversion_tasks(model)``, or a filtered list), as
    ``export_hf_weights`` takes them; when omitted, built here as ``export_hf_weights`` builds them
    (``build_conversion_tasks``, which exchanges the parameter names over the pipeline group). The tasks
    passed are not modified.

    Every rank of the model's groups calls it, as for ``export_hf_weights``; with one pipeline stage no
    collective runs at all, with several each stage learns the shapes of the others' tensors through
    Bridge's object exchange (``all_gather_object``). No weight is gathered or copied: the tensors Bridge
    produces are ``meta``. Not covered: models whose LoRA adapters Bridge merges during the export (it
    materialises the adapters for real), and Bridge 0.6's FP8 export tasks unless passed in.
    """
    chunks = model if isinstance(model, list) else [model]
    if conversion_tasks is None:
        # What export_hf_weights does without tasks (get_conversion_tasks wants a loaded checkpoint).
        conversion_tasks = bridge._model_bridge.build_conversion_tasks(bridge.hf_pretrained, chunks)
    meta_tasks = [_on_meta(task) for task in conversion_tasks]
    with shape_only():
        exported = iter(bridge.export_hf_weights(chunks, cpu=False, show_progress=False,
                                                 conversion_tasks=meta_tasks))
    try:
        while True:
            with shape_only():
                try:
                    name, tensor = next(exported)
                except StopIteration:
                    return
            yield ExportedShape(str(name), tensor.shape, tensor.dtype)
    finally:
        close = getattr(exported, "close", None)
        if close is not None:
            with shape_only():  # Bridge's own clean-up, if it has any, runs shape-only too
                close()


def _on_meta(task: Any) -> Any:
    """``task`` with its parameter replaced by a meta tensor of the same shape, dtype and attributes."""
    if task is None or getattr(task, "param_weight", None) is None:
        return task
    weight = task.param_weight
    # A DTensor's shape is the global one: its meta stand-in needs no gather.
    meta = torch.empty(tuple(weight.shape), dtype=weight.dtype, device="meta")
    if isinstance(weight, torch.nn.Parameter):
        meta = torch.nn.Parameter(meta, requires_grad=weight.requires_grad)
    for name, value in vars(weight).items():
        # Megatron's parallel attributes (tensor_model_parallel, partition_dim, partition_stride, ...),
        # which the mappings read; not torch's or a subclass's private state.
        if not name.startswith("_"):
            setattr(meta, name, value)
    return dataclasses.replace(task, param_weight=meta)
