"""Self-check of ``vllm.lora_from_tensors``: an adapter from tensors is the adapter vLLM reads from a folder.

vLLM's own worker LoRA manager (``_tiny_lora``) loads one adapter twice: from a PEFT folder written
to a temporary directory, through upstream's ``_load_adapter`` (``from_local_checkpoint``), and from
the same tensors and config in memory, through the public API (``patchkit.patches.vllm.lora``). The
two ``LoRAModel`` must be equal bit for bit (every ``lora_a``/``lora_b`` with its dtype, rank, scaling,
modules); the adapter added from tensors must serve (its id listed by the manager) and leave the
caller's tensors unchanged; a tensor of the wrong shape must be refused by name with nothing loaded.
"""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect


def check_lora_from_tensors(context: CheckContext) -> None:
    """An adapter loaded from tensors equals the one vLLM loads from its PEFT folder; bad tensors are refused."""
    from vllm.lora.request import LoRARequest

    from ..._checks._cpu_stand_in import vllm_context
    from .. import LoRATensorsError, TensorLoRARequest, add_lora_from_tensors
    from . import _tiny_lora as tiny

    # In the LoRA dtype: vLLM's .to(dtype) would otherwise hand over copies, and the check below would prove nothing.
    config, tensors = tiny.peft_config(), tiny.adapter_tensors(seed=3, dtype=tiny.LORA_DTYPE)
    before = {name: tensor.clone() for name, tensor in tensors.items()}
    with vllm_context("cpu"), tiny.unpinned_without_cuda():  # the LoRA manager keeps adapters on the CPU in every case
        manager: Any = tiny.worker_lora_manager()
        with tiny.peft_folder(config, tensors) as folder:
            from_folder = manager._load_adapter(LoRARequest("from-folder", 1, str(folder)))
        try:
            from_tensors = manager._load_adapter(TensorLoRARequest("from-tensors", 1, peft_config=config,
                                                                   lora_tensors=tensors))
        except Exception as exc:
            raise SelfCheckFailed("vLLM's worker LoRA manager loads an adapter given as tensors",
                                  "a LoRAModel", f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        found = tiny.differences(from_tensors, from_folder)
        expect(not found, "the LoRAModel loaded from tensors equals the one vLLM loads from the PEFT folder "
               "(every lora_a/lora_b bit for bit, rank, scaling, modules)", "no difference", found[:3])
        expect(add_lora_from_tensors(manager, "served", 2, tensors, config) and 2 in manager.list_adapters(),
               "the adapter added from tensors is registered with the worker", "id 2 listed",
               sorted(manager.list_adapters()))
        changed = sorted(name for name, tensor in tensors.items() if not torch.equal(tensor, before[name]))
        expect(not changed, "the caller's tensors after vLLM added the adapter (it folds the scaling into "
               "lora_b in place)", "unchanged", changed[:3])
        wrong = dict(tensors)
        name = next(n for n in wrong if n.endswith("q_proj.lora_B.weight"))
        wrong[name] = wrong[name][:-1]
        try:
            add_lora_from_tensors(manager, "wrong", 3, wrong, config)
        except LoRATensorsError as exc:
            expect(exc.tensor == name, "the tensor a refusal names", name, exc.tensor)
        else:
            raise SelfCheckFailed("an adapter with a q_proj.lora_B one row short", "LoRATensorsError", "loaded")
        expect(3 not in manager.list_adapters(), "adapters after a refused load", "id 3 absent",
               sorted(manager.list_adapters()))
