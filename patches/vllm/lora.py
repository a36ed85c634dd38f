"""Public API: hand vLLM a LoRA adapter as tensors and a PEFT config, with no folder on disk.

vLLM (0.24-0.33) loads LoRA adapters only from a PEFT folder (``LoRARequest.lora_path``); RL
trainers that sync an adapter to their rollout engine every step write it to disk for that. With
``vllm.lora_from_tensors`` applied, the worker takes the adapter from memory::

    from patchkit.patches.vllm.lora import add_lora_from_tensors

    # in the worker process: a worker extension method, or a function sent with collective_rpc
    llm.collective_rpc(add_lora_from_tensors, args=("policy", 1, tensors, peft_config))
    llm.generate(prompts, lora_request=LoRARequest("policy", 1, "tensors://policy"))

``tensors`` is ``{name: tensor}`` under PEFT's names (``get_peft_model_state_dict``, as
``adapter_model.safetensors`` holds them); ``peft_config`` is ``adapter_config.json`` as a dict
(``LoraConfig.to_dict()``). The ``LoRAModel`` built is the one vLLM builds from that folder. Bad input
raises :class:`LoRATensorsError` naming the tensor, and the worker's adapters stay as they were.

:class:`TensorLoRARequest` is the request type behind it (vLLM's ``LoRARequest`` plus ``peft_config``
and ``lora_tensors``), for callers that drive ``worker.add_lora`` or the worker's LoRA manager
themselves. Requests travel to the engine core through msgpack, which drops the subclass: hand a
``TensorLoRARequest`` to the worker in the worker's process. Generation requests then name the
adapter by ``lora_int_id`` with a plain ``LoRARequest``; once vLLM's LRU cache (``max_cpu_loras``)
evicts the adapter, such a request would look for a folder: add it again from tensors first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._errors import LoRAFromTensorsUnavailableError, LoRATensorsError

if TYPE_CHECKING:
    import torch

    from ._lora_request import TensorLoRARequest

__all__ = [
    "LoRAFromTensorsUnavailableError", "LoRATensorsError", "TensorLoRARequest", "add_lora_from_tensors", "PATCH_ID",
]

PATCH_ID = "vllm.lora_from_tensors"


def __getattr__(name: str) -> Any:
    if name == "TensorLoRARequest":  # subclasses vLLM's LoRARequest: imported on first use
        from ._lora_request import TensorLoRARequest

        return TensorLoRARequest
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_lora_from_tensors(
    worker: Any,
    lora_name: str,
    lora_int_id: int,
    tensors: Mapping[str, torch.Tensor],
    peft_config: Mapping[str, Any],
    *,
    load_inplace: bool = True,
) -> bool:
    """Add (or, with ``load_inplace``, replace) adapter ``lora_int_id`` on ``worker`` from tensors.

    ``worker`` is a vLLM worker (``Worker``/``CPUWorker``: its ``add_lora``), a model runner (the same
    method) or a ``WorkerLoRAManager`` (its ``add_adapter``); as the first argument this function can be
    sent with ``LLM.collective_rpc``. Returns what vLLM's ``add_adapter`` returns. The caller's tensors
    are copied, never changed. Raises :class:`LoRATensorsError` (nothing loaded, nothing evicted) for
    a bad tensor or config, :class:`LoRAFromTensorsUnavailableError` (before anything is built) when
    ``vllm.lora_from_tensors`` is not installed in this process.
    """
    _require_patch()
    from ._lora_request import TensorLoRARequest

    request = TensorLoRARequest(lora_name=lora_name, lora_int_id=lora_int_id, load_inplace=load_inplace,
                                peft_config=dict(peft_config), lora_tensors=dict(tensors))
    add = getattr(worker, "add_lora", None) or worker.add_adapter
    return bool(add(request))


def _require_patch() -> None:
    import patchkit

    problem = patchkit.why_not_installed(PATCH_ID)
    if problem is None:
        return
    raise LoRAFromTensorsUnavailableError(
        f"{problem}: vLLM would look for an adapter folder named tensors://<name>; call "
        "patchkit.apply_all() in the worker process (the vLLM plugin does this in every vLLM process), or see "
        "`patchkit list` for the supported vLLM versions")
