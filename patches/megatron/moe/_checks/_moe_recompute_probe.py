"""What a tiny MoE GPT still holds after a training step: shared by the self-check and tests/megatron.

``megatron.moe_recompute_release`` is about memory kept alive between steps. These helpers build a
2-layer MoE ``GPTModel`` (optionally with MoE MTP layers) from upstream's local layer specs, run one
forward and backward, and walk everything reachable from the model afterwards: its modules'
attributes, plain Megatron objects hanging off them (the token dispatchers are not modules), and
the autograd graph behind any tensor found there (nodes, the tensors they saved, the leaves of
``AccumulateGrad``). Parameters and their gradients are left out: they live on whatever happens.
What remains is what a step left behind, counted as unique storages and their bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..._checks._tiny_gpt import make_batch

NUM_EXPERTS = 8
TOPK = 2
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
#: The shared expert's overlap caches (``SharedExpertMLP`` with ``moe_shared_expert_overlap``).
SHARED_EXPERT_CACHES = ("cached_fc1_input", "cached_fc2_input", "cached_fc2_output", "cached_output", "gate_score")
#: Dispatcher state that lives across steps by design: HybridEP's over-budget flag (0.18+), accumulated
#: over steps until ``reset_over_budget``.
PERSISTENT_TENSORS = frozenset({"token_dispatcher._comm_manager.over_budget"})


def build_moe_gpt(dispatcher: str = "alltoall", recompute: bool = True, mtp_num_layers: int | None = None,
                  seed: int = 0, config: Mapping[str, Any] | None = None) -> Any:
    """2-layer, hidden-64 GPT whose MLPs are 8-expert top-2 MoE layers (MTP layers too, if asked).

    ``dispatcher`` is upstream's ``moe_token_dispatcher_type`` (``"alltoall"``, ``"allgather"`` or
    ``"flex"``); ``recompute`` turns on full recompute of every layer (``recompute_granularity='full'``);
    ``config`` adds ``TransformerConfig`` fields (the flex backend, shared experts and their overlap...).
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    transformer_config = TransformerConfig(
        num_layers=2, hidden_size=64, ffn_hidden_size=32, num_attention_heads=4, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32, add_bias_linear=False,
        num_moe_experts=NUM_EXPERTS, moe_router_topk=TOPK, moe_token_dispatcher_type=dispatcher,
        mtp_num_layers=mtp_num_layers, mtp_loss_scaling_factor=0.1 if mtp_num_layers else None,
        **(RECOMPUTE if recompute else {}), **(config or {}),
    )
    layer_spec = get_gpt_layer_local_spec(num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    extra: dict[str, Any] = {}
    if mtp_num_layers:
        extra["mtp_block_spec"] = get_gpt_mtp_block_spec(transformer_config, layer_spec, use_transformer_engine=False)
    torch.manual_seed(seed)
    return GPTModel(config=transformer_config, transformer_layer_spec=layer_spec, vocab_size=128,
                    max_sequence_length=16, **extra)


@dataclass
class Step:
    """One forward and backward: the loss, every parameter's gradient, and what stayed reachable."""

    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    held: "Held"


@dataclass
class Held:
    """Tensors reachable from the model after a step, parameters and their gradients left out."""

    storages: dict[int, int] = field(default_factory=dict)  # storage address -> bytes
    with_history: list[str] = field(default_factory=list)  # where a tensor with autograd history was found

    @property
    def count(self) -> int:
        return len(self.storages)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def holders(self) -> list[str]:
        """The model attributes through which tensors with autograd history are reached."""
        return sorted({where.split(".grad_fn")[0] for where in self.with_history})


def train_step(model: Any, device: str = "cpu") -> Step:
    """Forward with labels, mean loss, backward; then what the model still reaches (see :func:`held_by`)."""
    batch = make_batch().to(device)
    model.zero_grad(set_to_none=True)
    per_token = model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels)
    loss = per_token.float().mean()
    loss.backward()
    loss = loss.detach()
    del per_token
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return Step(loss=loss, grads=grads, held=held_by(model))


def held_by(model: Any) -> Held:
    """Walk the model's attributes and the autograd graph behind them; count what is not a parameter."""
    parameters = {id(p) for p in model.parameters()}
    skip = parameters | {id(p.grad) for p in model.parameters() if p.grad is not None}
    held = Held()
    for where, obj in _walk(model):
        if isinstance(obj, torch.Tensor) and id(obj) not in skip:
            if obj.grad_fn is not None or (obj.requires_grad and id(obj) not in parameters):
                held.with_history.append(where)
            storage = obj.untyped_storage()
            if storage.nbytes():
                held.storages[storage.data_ptr()] = storage.nbytes()
    return held


def step_tensors(model: Any) -> dict[str, list[str]]:
    """By MoE layer: the tensors its dispatcher, the flex dispatcher's communication manager and its shared
    experts' overlap caches hold (what a step may leave there; :data:`PERSISTENT_TENSORS` left out)."""
    held: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        dispatcher = getattr(module, "token_dispatcher", None)
        if dispatcher is None:
            continue
        owners = {"token_dispatcher": dispatcher,
                  "token_dispatcher._comm_manager": getattr(dispatcher, "_comm_manager", None)}
        names = [f"{owner}.{attribute}" for owner, obj in owners.items() if obj is not None
                 for attribute, value in vars(obj).items() if isinstance(value, torch.Tensor)]
        shared = getattr(module, "shared_experts", None)
        if shared is not None:
            names += [f"shared_experts.{cache}" for cache in SHARED_EXPERT_CACHES
                      if isinstance(getattr(shared, cache, None), torch.Tensor)]
        held[name] = sorted(set(names) - PERSISTENT_TENSORS)
    return held


def _walk(root: Any) -> Iterator[tuple[str, Any]]:
    # Objects seen are kept, not just their ids: a graph node's Python wrapper is made on access,
    # and a freed wrapper's id is soon another's.
    seen: dict[int, Any] = {}
    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        where, obj = stack.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        yield where, obj
        stack.extend(_children(where, obj))


def _children(where: str, obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, torch.Tensor):
        return [(f"{where}.{name}", value) for name in ("grad", "grad_fn")
                if (value := _tensor_attribute(obj, name)) is not None]
    if isinstance(obj, dict):
        return [(f"{where}[{key!r}]", value) for key, value in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{where}[{index}]", value) for index, value in enumerate(obj)]
    if _is_graph_node(obj):
        return _node_children(where, obj)
    if isinstance(obj, torch.nn.Module):
        children = []
        for name, value in vars(obj).items():
            if name in ("_modules", "_parameters", "_buffers"):  # named as model.named_modules() does
                children.extend((f"{where}.{key}".lstrip("."), item) for key, item in value.items())
            else:
                children.append((f"{where}.{name}".lstrip("."), value))
        return children
    if type(obj).__module__.startswith("megatron."):  # a dispatcher, a router's replay state, ...
        return [(f"{where}.{name}", value) for name, value in vars(obj).items()]
    return []


def _tensor_attribute(tensor: torch.Tensor, name: str) -> Any:
    if name == "grad" and not tensor.is_leaf:
        return None  # a non-leaf has no .grad (and torch warns on reading it)
    return getattr(tensor, name)


def _is_graph_node(obj: Any) -> bool:
    return hasattr(obj, "next_functions") and hasattr(obj, "register_hook")


def _node_children(where: str, node: Any) -> list[tuple[str, Any]]:
    children: list[tuple[str, Any]] = [(f"{where}>{type(nxt).__name__}", nxt)
                                       for nxt, _ in node.next_functions if nxt is not None]
    variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf it accumulates into
    if variable is not None:
        children.append((f"{where}.variable", variable))
    for name in dir(node):
        if name.startswith("_saved_") or name == "saved_tensors":
            try:
                children.append((f"{where}.{name}", getattr(node, name)))
            except RuntimeError:  # freed by the backward that ran through it
                continue
    if hasattr(node, "__dict__"):  # a Python autograd Function's ctx (CheckpointFunction's run_function, ...)
        children.extend((f"{where}.{name}", value) for name, value in vars(node).items())
    return children
