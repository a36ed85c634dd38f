"""The LoRA-from-tensors API's function (``patchkit.patches.vllm.lora`` exports it; its docstring tells
the whole story)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._constants import LORA_FROM_TENSORS_PATCH_ID as PATCH_ID
from .._errors import LoRAFromTensorsUnavailableError

if TYPE_CHECKING:
    import torch


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
