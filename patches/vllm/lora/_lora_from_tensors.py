"""``WorkerLoRAManager._load_adapter`` for a :class:`TensorLoRARequest`: the adapter from memory.

Upstream's ``_load_adapter`` (``vllm/lora/worker_manager.py``) builds a ``LoRAModel`` from a PEFT
folder: the model's expected LoRA modules, ``PEFTHelper.from_local_dir`` (``adapter_config.json``
plus ``vllm_max_position_embeddings``), ``validate_legal``, the model's ``hf_to_vllm_mapper``, its
``lora_skip_prefixes``, then ``LoRAModel.from_local_checkpoint``, which checks every tensor name
against the expected modules, drops other expert-parallel ranks' experts and hands the tensors to
``LoRAModel.from_lora_tensors``. :func:`load_adapter_from_tensors` takes the same steps in the same
order with the folder's two files replaced by the request's ``peft_config`` and ``lora_tensors``,
so the ``LoRAModel`` is the one the folder would give (tests/vllm/test_lora_from_tensors.py compares
them tensor by tensor). Where the folder path fails late or silently, a tensor request is refused
first, with :class:`LoRATensorsError` naming the tensor, before anything reaches the manager:

- a name vLLM cannot parse, or a module the model serves no LoRA on (upstream: one ``ValueError``
  listing modules, after reading the file);
- a module with ``lora_A`` and no ``lora_B`` (or the reverse), a tensor of the wrong rank or of the
  wrong input/output size for the model's layer (upstream: ``None`` or a shape error while the
  adapter is activated into the layers' slots, after the LRU cache evicted another adapter).

The caller's tensors are copied: vLLM folds the scaling into ``lora_b`` in place when it adds the
adapter (``LoRALayerWeights.optimize``), which would rescale the caller's tensor (and any adapter
rebuilt from it later).

Each release's differences are data (:class:`ReleaseSteps`), read from ``_load_adapter`` in every
wheel 0.24.0-0.33.0: the view of ``hf_to_vllm_mapper`` it passes (0.24: the mapper; 0.25-0.28:
``get_unstacked_mapper()``; 0.29-0.33: ``get_rename_mapper()``) and the manager's validations after
the load (0.31: ``_validate_modules_to_save``, ``_validate_token_classification_lora``; 0.32:
``_validate_moe_lora_format`` first; 0.33: ``_validate_moe_lora_format``,
``_validate_classification_head_lora``).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from vllm.lora.lora_model import LoRAModel, _is_remote_expert_key
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.utils import is_base_embedding_weights, parse_fine_tuned_lora_name

from .._errors import LoRATensorsError
from ._lora_request import TensorLoRARequest

logger = logging.getLogger(__name__)

PEFT_NAMES = "<module>.lora_A.weight and <module>.lora_B.weight (PEFT's names)"


@dataclass(frozen=True)
class ReleaseSteps:
    """What one range of releases does around ``from_local_checkpoint`` in ``_load_adapter``."""

    mapper_view: str | None
    """The ``WeightsMapper`` method applied to the model's ``hf_to_vllm_mapper``; ``None``: the mapper as is."""
    validations: tuple[str, ...]
    """The adapter manager's ``_validate_*`` methods run on the loaded ``LoRAModel``, in upstream's order."""


STEPS_V024 = ReleaseSteps(mapper_view=None, validations=())
STEPS_V025 = ReleaseSteps(mapper_view="get_unstacked_mapper", validations=())
STEPS_V029 = ReleaseSteps(mapper_view="get_rename_mapper", validations=())
STEPS_V031 = ReleaseSteps(
    mapper_view="get_rename_mapper",
    validations=("_validate_modules_to_save", "_validate_token_classification_lora"),
)
STEPS_V032 = ReleaseSteps(
    mapper_view="get_rename_mapper",
    validations=("_validate_moe_lora_format", "_validate_modules_to_save", "_validate_token_classification_lora"),
)
STEPS_V033 = ReleaseSteps(
    mapper_view="get_rename_mapper",
    validations=("_validate_moe_lora_format", "_validate_classification_head_lora"),
)


def _wrap_for(steps: ReleaseSteps) -> Callable[[Callable[..., LoRAModel]], Callable[..., LoRAModel]]:
    def wrap_load_adapter(original: Callable[..., LoRAModel]) -> Callable[..., LoRAModel]:
        """``_load_adapter`` that loads a :class:`TensorLoRARequest` from memory; any other request as before."""

        @functools.wraps(original)
        def _load_adapter(self: Any, lora_request: Any) -> LoRAModel:
            if isinstance(lora_request, TensorLoRARequest):
                return load_adapter_from_tensors(self, lora_request, steps)
            return original(self, lora_request)

        return _load_adapter

    return wrap_load_adapter


wrap_load_adapter_v024 = _wrap_for(STEPS_V024)
wrap_load_adapter_v025 = _wrap_for(STEPS_V025)
wrap_load_adapter_v029 = _wrap_for(STEPS_V029)
wrap_load_adapter_v031 = _wrap_for(STEPS_V031)
wrap_load_adapter_v032 = _wrap_for(STEPS_V032)
wrap_load_adapter_v033 = _wrap_for(STEPS_V033)


def load_adapter_from_tensors(worker_manager: Any, lora_request: TensorLoRARequest, steps: ReleaseSteps) -> LoRAModel:
    """The ``LoRAModel`` upstream's ``_load_adapter`` would build from a PEFT folder holding this adapter."""
    adapter_manager = worker_manager._adapter_manager
    expected_lora_modules = expected_modules(adapter_manager)
    peft_helper = peft_helper_from_config(lora_request.peft_config, worker_manager.max_position_embeddings)

    # Validates the LoRA configuration against requirements before loading weights.
    try:
        peft_helper.validate_legal(worker_manager.lora_config)
    except ValueError as exc:
        raise LoRATensorsError(f"vLLM refuses the adapter's peft_config: {exc}", expected="a LoRA config this "
                               "engine serves (max_lora_rank, no DoRA, no bias)", found=str(exc)) from exc

    model = adapter_manager.model
    hf_to_vllm_mapper = getattr(model, "hf_to_vllm_mapper", None)
    if hf_to_vllm_mapper is not None and steps.mapper_view is not None:
        hf_to_vllm_mapper = getattr(hf_to_vllm_mapper, steps.mapper_view)()
    lora_skip_prefixes = getattr(model, "lora_skip_prefixes", None)

    tensors, names = checked_tensors(lora_request.lora_tensors, expected_lora_modules, peft_helper,
                                     hf_to_vllm_mapper, lora_skip_prefixes, adapter_manager.moe_ep_load_spec)
    try:
        lora = worker_manager._lora_model_cls.from_lora_tensors(
            lora_model_id=lora_request.lora_int_id,
            tensors=tensors,
            peft_helper=peft_helper,
            device="cpu",
            dtype=worker_manager.lora_config.lora_dtype,
            model_vocab_size=worker_manager.vocab_size,
            weights_mapper=hf_to_vllm_mapper,
            skip_prefixes=lora_skip_prefixes,
        )
    except (ValueError, RuntimeError) as exc:
        raise LoRATensorsError(f"vLLM refuses the adapter's tensors: {exc}", found=str(exc)) from exc
    lora.is_3d_lora_weight = lora_request.is_3d_lora_weight
    check_against_model(lora, adapter_manager, names)
    for validation in steps.validations:
        try:
            getattr(adapter_manager, validation)(lora)
        except ValueError as exc:
            raise LoRATensorsError(f"vLLM refuses the adapter ({validation}): {exc}", found=str(exc)) from exc
    logger.debug("LoRA adapter %r (id %d) loaded from %d tensors", lora_request.lora_name,
                 lora_request.lora_int_id, len(tensors))
    return lora


def expected_modules(adapter_manager: Any) -> set[str]:
    """The module names an adapter may target: upstream's loop over the supported and packed modules."""
    packed_modules_mapping = adapter_manager.packed_modules_mapping
    expected: list[str] = []
    for module in adapter_manager.supported_lora_modules:
        if module in packed_modules_mapping:
            expected.extend(packed_modules_mapping[module])
        else:
            expected.append(module)
        if module == "experts":
            expected.append(module)
    return set(expected)


def peft_helper_from_config(peft_config: Mapping[str, Any], max_position_embeddings: int | None) -> PEFTHelper:
    """``PEFTHelper.from_local_dir`` with the JSON already read: the same extra field, the same ``from_dict``."""
    if not isinstance(peft_config, Mapping):
        raise LoRATensorsError("peft_config must be a PEFT adapter_config.json as a dict", expected="a mapping",
                               found=type(peft_config).__name__)
    config = dict(peft_config)
    config["vllm_max_position_embeddings"] = max_position_embeddings
    try:
        return PEFTHelper.from_dict(config)
    except (ValueError, TypeError) as exc:
        raise LoRATensorsError(f"peft_config is not a PEFT LoRA config vLLM reads: {exc}",
                               expected="r, lora_alpha, target_modules and PEFT's other LoRA fields",
                               found=str(exc)) from exc


@dataclass
class TensorNames:
    """The caller's tensor names behind each loaded module (after the weights mapper)."""

    lora_a: dict[str, str]
    lora_b: dict[str, str]

    def of(self, module_name: str) -> str:
        return self.lora_a.get(module_name) or self.lora_b[module_name]


def checked_tensors(
    lora_tensors: Mapping[str, Any],
    expected_lora_modules: set[str],
    peft_helper: PEFTHelper,
    weights_mapper: Any,
    skip_prefixes: list[str] | None,
    moe_ep_spec: Any,
) -> tuple[dict[str, torch.Tensor], TensorNames]:
    """The tensors ``from_local_checkpoint`` would pass on, each a private contiguous CPU copy.

    Names are checked as upstream's ``check_unexpected_modules`` checks a file's keys (the same
    exemptions), each offending tensor named; experts of other expert-parallel ranks are dropped.
    """
    if not isinstance(lora_tensors, Mapping) or not lora_tensors:
        raise LoRATensorsError("lora_tensors must be a non-empty {name: tensor} mapping",
                               expected=PEFT_NAMES, found=repr(type(lora_tensors).__name__))
    unexpected: list[tuple[str, str]] = []
    names = TensorNames({}, {})
    tensors: dict[str, torch.Tensor] = {}
    for tensor_name, tensor in lora_tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise LoRATensorsError(f"LoRA tensor {tensor_name!r} is a {type(tensor).__name__}, not a torch.Tensor",
                                   tensor=tensor_name, expected="torch.Tensor", found=type(tensor).__name__)
        skipped = is_base_embedding_weights(tensor_name) or bool(
            skip_prefixes and LoRAModel._should_skip_module(tensor_name, skip_prefixes))
        if not skipped:
            try:
                module_name, is_lora_a = parse_fine_tuned_lora_name(tensor_name, weights_mapper)
            except ValueError as exc:
                raise LoRATensorsError(f"LoRA tensor {tensor_name!r} has no name vLLM can read: {exc}",
                                       tensor=tensor_name, expected=PEFT_NAMES, found=tensor_name) from exc
            (names.lora_a if is_lora_a else names.lora_b)[module_name] = tensor_name
            if "base_layer" not in tensor_name and not _is_expected(module_name, expected_lora_modules,
                                                                        peft_helper):
                unexpected.append((tensor_name, module_name))
        if moe_ep_spec is not None and _is_remote_expert_key(tensor_name, moe_ep_spec):
            continue
        tensors[tensor_name] = torch.empty(tensor.shape, dtype=tensor.dtype).copy_(tensor.detach())
    if unexpected:
        listed = ", ".join(f"{tensor!r} ({module})" for tensor, module in unexpected)
        raise LoRATensorsError(
            f"LoRA tensors target modules this model serves no LoRA on: {listed}; the model's LoRA "
            f"modules are {sorted(expected_lora_modules)}",
            tensor=unexpected[0][0], expected=str(sorted(expected_lora_modules)), found=unexpected[0][1])
    return tensors, names


def _is_expected(module_name: str, expected_lora_modules: set[str], peft_helper: PEFTHelper) -> bool:
    if ".experts" in module_name:
        return module_name[module_name.find(".experts") + 1:] in expected_lora_modules
    base_name = module_name.rsplit(".", 1)[-1]
    return base_name in expected_lora_modules or base_name in (peft_helper.modules_to_save or ())


def check_against_model(lora: LoRAModel, adapter_manager: Any, names: TensorNames) -> None:
    """Every module has both halves, of its rank and of its layer's input/output size."""
    for module_name, weights in lora.loras.items():
        for half, other, (present_half, missing_half) in (("lora_a", "lora_b", "BA"), ("lora_b", "lora_a", "AB")):
            if getattr(weights, half) is None:
                present = getattr(names, other)[module_name]
                missing = re.sub(rf"lora_(embedding_)?{present_half}", rf"lora_\g<1>{missing_half}", present)
                raise LoRATensorsError(f"LoRA tensor {missing!r} is missing: {present!r} has no partner",
                                       tensor=missing, expected=f"lora_{missing_half} of {module_name}",
                                       found="nothing")
        lora_a, lora_b = weights.lora_a, weights.lora_b
        if ".experts" in module_name or lora_a.dim() != 2 or lora_b.dim() != 2:
            continue  # expert stacks: vLLM's MoE packing checks them (pack_moe)
        _expect_shape(names.lora_a[module_name], lora_a, 0, weights.rank, "rank", module_name)
        _expect_shape(names.lora_b[module_name], lora_b, 1, weights.rank, "rank", module_name)
        served, in_features, out_features = _layer_sizes(adapter_manager, module_name)
        if not served:
            raise LoRATensorsError(
                f"LoRA tensor {names.of(module_name)!r} targets {module_name!r}, which this model does not have",
                tensor=names.of(module_name), expected="a module of the loaded model", found=module_name)
        if in_features is not None:
            _expect_shape(names.lora_a[module_name], lora_a, 1, in_features, "input size", module_name)
        if out_features is not None:
            _expect_shape(names.lora_b[module_name], lora_b, 0, out_features, "output size", module_name)


def _expect_shape(tensor_name: str, tensor: torch.Tensor, dim: int, size: int, what: str, module_name: str) -> None:
    if tensor.shape[dim] != size:
        raise LoRATensorsError(
            f"LoRA tensor {tensor_name!r} has shape {tuple(tensor.shape)}: dimension {dim} must be "
            f"{module_name}'s {what} {size}", tensor=tensor_name, expected=f"{what} {size} in dimension {dim}",
            found=str(tuple(tensor.shape)))


def _layer_sizes(adapter_manager: Any, module_name: str) -> tuple[bool, int | None, int | None]:
    """Whether a LoRA layer of the model serves ``module_name``, and its input size and the output size
    of this module's slice (``None`` where the layer is not a linear layer).

    A packed layer (``qkv_proj`` for ``q_proj``...) serves one slice per packed name.
    """
    modules = adapter_manager.modules
    if module_name in modules:
        base_layer = getattr(modules[module_name], "base_layer", None)
        return True, _size(base_layer, "input_size"), _size(base_layer, "output_size")
    prefix, _, base_name = module_name.rpartition(".")
    for packed_name, slice_names in adapter_manager.packed_modules_mapping.items():
        packed = f"{prefix}.{packed_name}" if prefix else packed_name
        if base_name in slice_names and packed in modules:
            base_layer = getattr(modules[packed], "base_layer", None)
            output_sizes = getattr(base_layer, "output_sizes", None)
            index = slice_names.index(base_name)
            out = output_sizes[index] if isinstance(output_sizes, (list, tuple)) and index < len(output_sizes) else None
            return True, _size(base_layer, "input_size"), out
    return False, None, None


def _size(layer: Any, name: str) -> int | None:
    value = getattr(layer, name, None)
    return value if isinstance(value, int) else None
