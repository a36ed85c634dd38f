"""``TensorLoRARequest``: vLLM's ``LoRARequest`` that carries its adapter instead of naming a folder.

vLLM's ``LoRARequest`` (``vllm/lora/request.py``, the same fields in 0.24-0.33 but for 0.24-0.31's
``tensorizer_config_dict``) is a ``msgspec.Struct`` that names an adapter folder in ``lora_path``;
the worker's ``_load_adapter`` reads ``adapter_config.json`` and ``adapter_model.safetensors`` from
it. This subclass adds the two things those files hold: ``peft_config`` (the JSON's content as a
dict) and ``lora_tensors`` (the safetensors' content, ``{name: tensor}`` under PEFT's names). With
``vllm.lora_from_tensors`` applied, a worker loads it from memory.

``lora_path`` is kept because vLLM requires it (``__post_init__`` asserts it is not empty) and
compares requests by name: when none is given it is set to ``tensors://<lora_name>``, which is no
folder, so a worker without the patch fails to find the adapter instead of loading another one.

A request with tensors is for the worker's own process (``LLM.collective_rpc`` with a function, a
worker extension): vLLM's engine-core client serialises requests with msgpack, which would drop the
subclass on the way.
"""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.lora.request import LoRARequest

IN_MEMORY_SCHEME = "tensors://"


class TensorLoRARequest(LoRARequest):  # type: ignore[misc]
    """A ``LoRARequest`` whose adapter is ``peft_config`` (a PEFT ``adapter_config.json`` as a dict)
    and ``lora_tensors`` (``{name: tensor}``, PEFT's names, as ``adapter_model.safetensors`` holds them)."""

    peft_config: dict[str, Any] = msgspec.field(default_factory=dict)
    lora_tensors: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lora_path:
            self.lora_path = f"{IN_MEMORY_SCHEME}{self.lora_name}"
        super().__post_init__()
