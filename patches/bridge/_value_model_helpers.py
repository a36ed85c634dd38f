"""Megatron-Bridge 0.5's value-model helpers, for Bridge 0.2 to 0.4.

Bridge 0.5 added to ``megatron.bridge.training.utils.train_utils`` what an RL trainer needs to turn a
causal LM into a critic or reward model, and listed the value head's class name as replicated in
``AutoMapping``'s registry:

* ``LinearForLastLayer``: a bias-free ``nn.Linear`` that takes the output layer's place. It accepts the
  keywords ``GPTModel`` passes its output layer (``weight``, ``runtime_gather_output``) and ignores them,
  returns Megatron's ``(output, bias)`` pair with the output in float32, and gathers the sequence
  dimension back when sequence parallelism split it.
* ``create_value_head_hook`` / ``make_value_model``: a pre-wrap hook that gives the last pipeline stage
  (each last virtual stage under virtual pipelining) that head.
* ``freeze_moe_router``: stops gradients to MoE router and shared-expert gate parameters.

This module is the same behaviour, written for the releases before (the engine adds the names to
``train_utils`` and registers the class name with ``AutoMapping``, so Bridge's export copies the head's
weight whole rather than failing to tell its parallelism).
"""

from __future__ import annotations

from typing import Callable, Union

import torch
from megatron.bridge.models.conversion.param_mapping import AutoMapping
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.module import MegatronModule

ModelList = list[MegatronModule]
ModelHook = Callable[[ModelList], Union[ModelList, None]]

#: The class name ``AutoMapping`` detects the value head's parallelism by.
VALUE_HEAD_CLASS = "LinearForLastLayer"
#: The ``(module attribute, parameter)`` pairs a frozen MoE layer stops training.
_ROUTING_PARAMETERS = (("router", "weight"), ("router", "bias"), ("shared_experts", "gate_weight"),
                       ("shared_experts", "gate_bias"))

#: Whether :func:`register_value_head` added the class name (and :func:`unregister_value_head` must take it out).
_registered: list[str] = []


class LinearForLastLayer(torch.nn.Linear):
    """A replicated, bias-free projection in the place of a Megatron output layer (a value head).

    Called like Megatron's output layer: ``weight`` and ``runtime_gather_output`` are accepted and
    ignored (the head has its own weight and is never split over tensor-parallel ranks).
    """

    def __init__(self, input_size: int, output_size: int, sequence_parallel: bool) -> None:
        super().__init__(in_features=input_size, out_features=output_size, bias=False)
        self.sequence_parallel = sequence_parallel
        if sequence_parallel:
            # Megatron all-reduces the gradients of parameters marked so over the tensor-parallel group:
            # each rank saw only its slice of the sequence.
            self.weight.sequence_parallel = True

    def forward(
        self,
        input_: torch.Tensor,
        weight: torch.Tensor | None = None,
        runtime_gather_output: bool | None = None,
    ) -> tuple[torch.Tensor, None]:
        """``(values in float32, None)``; the whole sequence when sequence parallelism split it."""
        del weight, runtime_gather_output
        values = super().forward(input_).float()
        if self.sequence_parallel:
            values = tensor_parallel.gather_from_sequence_parallel_region(values, tensor_parallel_output_grad=False)
        return values, None


def _model_chunks(model: ModelList | MegatronModule) -> ModelList:
    return model if isinstance(model, list) else [model]


def _last_stage_flags() -> list[bool]:
    """For each model chunk this rank holds (one per virtual stage), whether it is a last pipeline stage."""
    virtual_stages = parallel_state.get_virtual_pipeline_model_parallel_world_size()
    if parallel_state.get_pipeline_model_parallel_world_size() > 1 and virtual_stages is not None:
        return [parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
                for stage in range(virtual_stages)]
    return [parallel_state.is_pipeline_last_stage()]


def create_value_head_hook(hidden_size: int, sequence_parallel: bool, output_size: int = 1) -> ModelHook:
    """A pre-wrap model hook that puts a fresh :class:`LinearForLastLayer` (``hidden_size`` to
    ``output_size``) in the ``output_layer`` of every chunk that is a last pipeline stage.

    The hook takes one module or the list of virtual-stage chunks and returns the list; it raises
    ``ValueError`` when the number of chunks is not the number of virtual stages of this rank.
    """

    def hook(model: ModelList | MegatronModule) -> ModelList:
        chunks = _model_chunks(model)
        last_stage = _last_stage_flags()
        if len(last_stage) != len(chunks):
            raise ValueError(
                "Model list length and pipeline post-process list length must match. "
                f"Got {len(chunks)} model chunks and {len(last_stage)} post-process flags."
            )
        for chunk, is_last in zip(chunks, last_stage, strict=True):
            if is_last:
                chunk.output_layer = LinearForLastLayer(
                    input_size=hidden_size, output_size=output_size, sequence_parallel=sequence_parallel
                )
        return chunks

    return hook


def make_value_model(hidden_size: int, sequence_parallel: bool) -> ModelHook:
    """:func:`create_value_head_hook` with one output: a scalar value per token."""
    return create_value_head_hook(hidden_size=hidden_size, sequence_parallel=sequence_parallel)


def freeze_moe_router(model: ModelList | MegatronModule) -> ModelList:
    """Set ``requires_grad=False`` on the router weight and bias and the shared-expert gate weight and
    bias of every decoder layer that has them; returns the chunks as a list. Layers without an ``mlp``
    and chunks without ``decoder.layers`` are left alone."""
    chunks = _model_chunks(model)
    for chunk in chunks:
        layers = getattr(getattr(chunk, "decoder", None), "layers", None)
        if layers is None:
            continue
        for layer in layers:
            mlp = getattr(layer, "mlp", None)
            for owner_name, parameter_name in _ROUTING_PARAMETERS:
                parameter = getattr(getattr(mlp, owner_name, None), parameter_name, None)
                if parameter is not None:
                    parameter.requires_grad = False
    return chunks


def register_value_head() -> None:
    """List the value head's class as replicated in ``AutoMapping``'s registry (Bridge 0.5 ships it listed)."""
    if VALUE_HEAD_CLASS not in AutoMapping._MODULE_TYPE_REGISTRY["replicated"]:
        AutoMapping.register_module_type(VALUE_HEAD_CLASS, "replicated")
        _registered.append(VALUE_HEAD_CLASS)


def unregister_value_head() -> None:
    """Take out of ``AutoMapping``'s registry what :func:`register_value_head` put in."""
    while _registered:
        AutoMapping._MODULE_TYPE_REGISTRY["replicated"].discard(_registered.pop())
