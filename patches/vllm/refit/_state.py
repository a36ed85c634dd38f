"""What patchkit remembers about one quantized vLLM layer so it can be refitted.

Recorded by ``_record`` around the layer's first ``process_weights_after_loading``:
the checkpoint-format parameters that ``create_weights`` registered (vLLM parameter class, shape,
dtype, and the attribute dict that carries ``weight_loader``/``_input_dim``/``_output_dim``), and
the kernel-format tensors that processing produced. What a refit must supply comes from those
parameters alone, never from what the first load wrote: RL frameworks start vLLM with
``load_format="dummy"``, where no weight went through a loader before the first refit.
The state lives on the layer itself (not in a global map), so it is freed with the layer even
though weight loaders are bound to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ._coverage import Coverage

STATE_ATTR = "_patchkit_refit_state"
#: names of the parameters the quant method's ``create_weights`` registered on the layer
CREATED_ATTR = "_patchkit_created_params"

# Loaded in place by the layer's own loader and never touched by the quant method's processing.
UNPROCESSED_PARAMS = frozenset({"bias"})

# Method attributes holding plain values are recomputed by each processing; objects (kernels,
# quant configs) keep their identity because captured CUDA graphs reference them.
_SCALAR_TYPES = (bool, int, float, str, type(None), torch.dtype)


@dataclass(frozen=True)
class ParamSpec:
    """A checkpoint-format parameter, enough to build an equivalent empty one."""

    name: str
    cls: type
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    attrs: dict[str, Any]
    #: a placeholder the layer's method never reads (W4A16's input scales): loaded when present,
    #: not demanded when absent
    optional: bool = False
    #: for a parameter vLLM padded beyond the checkpoint (MXFP4 MoE rounded up to the kernel's tile):
    #: the checkpoint's shape of it. The loaders fill that many elements; the rest stays the zeros
    #: ``create_weights`` put there. ``None``: the checkpoint fills the whole parameter.
    checkpoint_shape: tuple[int, ...] | None = None

    @classmethod
    def of(
        cls,
        name: str,
        param: torch.nn.Parameter,
        optional: bool = False,
        checkpoint_shape: tuple[int, ...] | None = None,
    ) -> ParamSpec:
        return cls(
            name=name,
            cls=type(param),
            shape=tuple(param.shape),
            stride=tuple(param.stride()),
            dtype=param.dtype,
            device=param.device,
            attrs=dict(param.__dict__),
            optional=optional,
            checkpoint_shape=checkpoint_shape if checkpoint_shape != tuple(param.shape) else None,
        )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def padded(self) -> bool:
        return self.checkpoint_shape is not None

    @property
    def required(self) -> int:
        """Elements a refit must write: the whole parameter (its checkpoint part where padded), or
        nothing for a placeholder."""
        if self.optional:
            return 0
        return math.prod(self.checkpoint_shape) if self.checkpoint_shape is not None else self.numel

    def empty(self) -> torch.Tensor:
        """Uninitialised storage of the recorded shape, strides, dtype and device."""
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)

    def staging_storage(self) -> torch.Tensor:
        """Storage for a refit to load into: uninitialised (the loaders write every element), or
        zeros where the parameter is padded, as ``create_weights`` made it (the loaders write only the
        checkpoint's part; the padding must be zero, whatever a dummy start or the last refit left)."""
        storage = self.empty()
        return storage.zero_() if self.padded else storage

    def materialize(self) -> torch.nn.Parameter:
        """A new, uninitialised parameter of the recorded vLLM class with the recorded loader."""
        param = torch.nn.Parameter(self.empty(), requires_grad=False)
        # vLLM parameter constructors need loader and dims as arguments whose names differ per
        # class; restoring class and attribute dict reproduces what create_weights built.
        param.__class__ = self.cls
        param.__dict__.update(self.attrs)
        return param

    def describe(self) -> str:
        if self.checkpoint_shape is not None:
            return f"{shape_text(self.checkpoint_shape)} padded to {shape_text(self.shape)} {self.dtype}"
        return f"{shape_text(self.shape)} {self.dtype}"


@dataclass
class KernelTensors:
    """The layer's tensors after processing, by kind, so they can be put back as they were.

    ``served`` are tensors the kernel reads that are not the layer's own (the format row's
    ``served_tensors``: MXFP4 on Triton keeps its weights in triton_kernels wrappers and its scales in
    the method's precision configs); a refit copies into them like into the layer's. ``objects`` are
    what processing left on the layer under a checkpoint parameter's name that is no tensor (the
    triton_kernels wrapper in place of ``w13_weight``): put back with the tensors, and moved aside
    while a refit stages that parameter.
    """

    params: dict[str, torch.nn.Parameter]
    buffers: dict[str, torch.Tensor]
    non_persistent: frozenset[str]
    attrs: dict[str, torch.Tensor]
    served: dict[str, torch.Tensor] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        layer: torch.nn.Module,
        served: Mapping[str, torch.Tensor] | None = None,
        checkpoint_names: Iterable[str] = (),
    ) -> KernelTensors:
        return cls(
            params={n: p for n, p in layer._parameters.items() if p is not None},
            buffers={n: b for n, b in layer._buffers.items() if b is not None},
            non_persistent=frozenset(layer._non_persistent_buffers_set),
            attrs={
                n: v
                for n, v in vars(layer).items()
                if isinstance(v, torch.Tensor) and not n.startswith("_patchkit")
            },
            served=dict(served or {}),
            objects={
                n: vars(layer)[n]
                for n in checkpoint_names
                if n in vars(layer) and not isinstance(vars(layer)[n], torch.Tensor)
            },
        )

    def names(self) -> set[str]:
        return set(self.params) | set(self.buffers) | set(self.attrs) | set(self.served)

    def items(self) -> list[tuple[str, torch.Tensor]]:
        return [*self.params.items(), *self.buffers.items(), *self.attrs.items(), *self.served.items()]

    def get(self, name: str) -> torch.Tensor | None:
        for group in (self.params, self.buffers, self.attrs, self.served):
            if name in group:
                return group[name]
        return None

    def move_objects_aside(self, layer: torch.nn.Module) -> None:
        """Take :attr:`objects`' names off the layer, so parameters of those names can be registered."""
        for name in self.objects:
            vars(layer).pop(name, None)

    def place_on(self, layer: torch.nn.Module) -> None:
        """Make exactly these tensors (and :attr:`objects`) the layer's tensors."""
        clear_tensors(layer)
        for name, param in self.params.items():
            layer.register_parameter(name, param)
        for name, buffer in self.buffers.items():
            layer.register_buffer(name, buffer, persistent=name not in self.non_persistent)
        for name, tensor in self.attrs.items():
            object.__setattr__(layer, name, tensor)
        for name, value in self.objects.items():
            object.__setattr__(layer, name, value)


@dataclass
class LoadLog:
    """What the weight loaders wrote during one refit, per parameter name."""

    copied: dict[str, int] = field(default_factory=dict)  #: elements written (capped at numel)
    shapes: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)  #: refit tensors seen
    #: which regions were written, by which loader calls (``_coverage``)
    coverage: dict[str, Coverage] = field(default_factory=dict)

    def record(self, name: str, numel_copied: int, capacity: int, shape: tuple[int, ...]) -> None:
        self.copied[name] = min(capacity, self.copied.get(name, 0) + numel_copied)
        seen = self.shapes.setdefault(name, [])
        if shape not in seen:
            seen.append(shape)

    def coverage_of(self, name: str) -> Coverage:
        coverage = self.coverage.get(name)
        if coverage is None:
            coverage = self.coverage[name] = Coverage()
        return coverage

    def loaded(self) -> set[str]:
        return {name for name, count in self.copied.items() if count > 0}


@dataclass
class Staging:
    """One refit in progress on a layer."""

    params: dict[str, torch.nn.Parameter]
    log: LoadLog = field(default_factory=LoadLog)


@dataclass
class LayerRefitState:
    checkpoint: dict[str, ParamSpec]
    kernel: KernelTensors
    method_state: dict[str, Any]
    staging: Staging | None = None
    #: the kernel backend the layer was recorded on, for a format with several (MXFP4: ``MARLIN``,
    #: ``TRITON``), else ``None``
    backend: str | None = None
    #: the checkpoint-format parameters and their attribute dicts (with the counting loaders), built
    #: at the layer's first refit and given fresh storage by each refit (empty in between: they
    #: hold no memory)
    staged_params: dict[str, tuple[torch.nn.Parameter, dict[str, Any]]] | None = None


def capture_checkpoint_specs(
    layer: torch.nn.Module,
    created: frozenset[str] | None,
    optional: frozenset[str],
    checkpoint_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, ParamSpec]:
    """The checkpoint parameters ``create_weights`` registered (``created``), as they are now.

    ``created`` is None for a layer built before the patch was applied: then every parameter but
    the ones the layer loads itself (``bias``) counts. ``checkpoint_shapes`` gives the checkpoint's
    shape of each parameter vLLM padded (``ParamSpec.checkpoint_shape``).
    """
    shapes = checkpoint_shapes or {}
    return {
        name: ParamSpec.of(name, param, optional=name in optional, checkpoint_shape=shapes.get(name))
        for name, param in layer._parameters.items()
        if param is not None
        and (name in created if created is not None else name not in UNPROCESSED_PARAMS)
    }


def capture_method_state(method: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(method).items() if not isinstance(v, _SCALAR_TYPES)}


def restore_method_state(method: Any, saved: dict[str, Any]) -> None:
    for name, value in saved.items():
        setattr(method, name, value)


def clear_tensors(layer: torch.nn.Module, keep: frozenset[str] = UNPROCESSED_PARAMS) -> None:
    """Remove every parameter, buffer and plain tensor attribute except ``keep``.

    Slots registered as ``None`` hold no tensor and stay: vLLM's fused-MoE layer reads its
    ``_expert_map`` buffer, ``None`` without expert parallelism, on every forward.
    """
    for name in [n for n, p in layer._parameters.items() if n not in keep and p is not None]:
        del layer._parameters[name]
    for name in [n for n, b in layer._buffers.items() if n not in keep and b is not None]:
        del layer._buffers[name]
        layer._non_persistent_buffers_set.discard(name)
    for name in [
        n for n, v in vars(layer).items() if isinstance(v, torch.Tensor) and n not in keep
    ]:
        object.__delattr__(layer, name)


def shape_text(shape: tuple[int, ...] | torch.Size) -> str:
    return str(tuple(shape))


def describe_tensor(tensor: torch.Tensor) -> str:
    return f"{shape_text(tuple(tensor.shape))} {tensor.dtype}"
