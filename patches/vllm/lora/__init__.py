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

The family's patch, ``vllm.lora_from_tensors``, is declared beside this file; the names below are
imported from their private modules on first use (PEP 562), so importing this package, as the
catalogue does for its declarations, imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports
from .._constants import LORA_FROM_TENSORS_PATCH_ID as PATCH_ID
from .._errors import LoRAFromTensorsUnavailableError, LoRATensorsError

if TYPE_CHECKING:
    from ._api import add_lora_from_tensors
    from ._lora_request import TensorLoRARequest

#: Imported on first use (``TensorLoRARequest`` subclasses vLLM's ``LoRARequest``); the errors and
#: ``PATCH_ID`` above are bound now, so a caller catches them without importing vLLM.
_EXPORTS = {"add_lora_from_tensors": "._api", "TensorLoRARequest": "._lora_request"}
__all__ = [
    "LoRAFromTensorsUnavailableError", "LoRATensorsError", "PATCH_ID", "TensorLoRARequest", "add_lora_from_tensors",
]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
