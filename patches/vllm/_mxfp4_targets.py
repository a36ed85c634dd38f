"""Which vLLM MXFP4 fused-MoE layers a refit can take: the method classes and, per layer, why not.

vLLM (0.24-0.33, ``model_executor/layers/quantization/mxfp4.py``) has two MXFP4 MoE methods:
``GptOssMxfp4MoEMethod`` (gpt-oss checkpoints: ``quant_method: mxfp4`` with ``model_type: gpt_oss``,
and on 0.24 every ``mxfp4`` checkpoint) and ``Mxfp4MoEMethod`` (the canonical ``mxfp4`` method, 0.29+).
Both pick a backend at construction (``method.mxfp4_backend``, from
``fused_moe/oracle/mxfp4.py``) and convert the checkpoint tensors to that backend's layout in
``process_weights_after_loading``.

A refit re-runs that processing on fresh checkpoint tensors and copies what lands on the layer into
the tensors in use. That is exact only where every tensor the kernel reads lives on the layer:

- ``MARLIN`` (CUDA GPUs of capability 7.5+; what ``--moe-backend marlin`` asks for): the
  weights are repacked and the scales permuted into new layer parameters; the method's quant config
  and kernel hold those parameter objects, which a refit keeps. Proven on CPU against vLLM's own first
  load (tests/vllm/test_mxfp4_moe_refit.py).
- Every other backend is refused: the Triton backends keep their swizzled scales inside the method's
  ``w13_precision_config``/``w2_precision_config`` objects (a refit would leave them stale), and the
  FlashInfer, AITER, CUTLASS, DeepGEMM, CPU, XPU, Humming and emulation backends were not run here
  (their processing needs their own GPU libraries or, for CPU, vLLM's CPU build), so nothing shows
  what they keep besides the layer's tensors.

A padded layer (vLLM rounds ``hidden_size``/``intermediate_size`` up to the backend's tile, Marlin:
256/128) is refused too: vLLM's gpt-oss loader writes the checkpoint into the top-left corner of the
padded parameter, which ``create_weights`` zeroed; a refit stages uninitialised parameters and demands
every element, so it would refuse every such load.
"""

from __future__ import annotations

import functools
from typing import Any

_METHOD_NAMES = ("GptOssMxfp4MoEMethod", "Mxfp4MoEMethod")
#: the ``Mxfp4MoeBackend`` member names a refit is proven on
REFITTABLE_BACKENDS = frozenset({"MARLIN"})

#: What a refit takes of MXFP4, for error messages.
SUPPORTED = "MXFP4 fused-MoE layers on vLLM's MARLIN backend, unpadded (vllm.mxfp4_moe_refit)"


@functools.cache
def mxfp4_method_classes() -> tuple[type, ...]:
    from vllm.model_executor.layers.quantization import mxfp4

    return tuple(cls for name in _METHOD_NAMES if (cls := getattr(mxfp4, name, None)) is not None)


def is_mxfp4_method(method: Any) -> bool:
    return type(method) in mxfp4_method_classes()


def backend_name(method: Any) -> str:
    backend = getattr(method, "mxfp4_backend", None)
    return str(getattr(backend, "name", backend))


def unrefittable_reason(method: Any) -> str | None:
    """Why a layer with MXFP4 method ``method`` cannot be refitted, or ``None`` when it can."""
    backend = backend_name(method)
    if backend not in REFITTABLE_BACKENDS:
        return f"MXFP4 backend {backend}; a refit supports {', '.join(sorted(REFITTABLE_BACKENDS))}"
    moe = getattr(method, "moe", None)
    padded = [
        f"{label} {unpadded} -> {dim}"
        for label, dim, unpadded in (
            ("hidden size", getattr(moe, "hidden_dim", None), getattr(moe, "hidden_dim_unpadded", None)),
            ("intermediate size", getattr(moe, "intermediate_size_per_partition", None),
             getattr(moe, "intermediate_size_per_partition_unpadded", None)),
        )
        if unpadded is not None and dim != unpadded
    ]
    if padded:
        return f"MXFP4 backend {backend} with padded sizes ({', '.join(padded)})"
    return None
