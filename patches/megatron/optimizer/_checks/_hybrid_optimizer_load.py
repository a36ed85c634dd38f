"""A ``HybridDeviceOptimizer`` loading the state dict a trained one saves, with fp32 and bf16 parameters.

What the ``megatron.hybrid_optimizer_fp32_state`` check and its tests share. The optimizer is
upstream's own class, built as ``get_megatron_optimizer`` builds it for CPU offloading
(``param_update_in_fp32=True``) with torch's ``AdamW`` for both sides and the parameters on CPU,
so one CPU sub-optimizer holds them all. Stepping needs CUDA (its gradient copies go through CUDA
streams and GPU/CPU parameter pairs), so the state dict is the one a stepped optimizer saves, built
here in its layout: AdamW's ``step``, ``exp_avg``, ``exp_avg_sq`` and the fp32 ``master_param``
that ``_sync_sub_optimizers_state_to_hdo`` adds to each parameter's state.

On CPU, ``_init_sub_optimizers`` asks ``torch.cuda.current_stream()`` for its copy streams (unused
here): Megatron's CPU stand-in answers it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import torch

#: The cases: the parameters' dtypes. All fp32 is what the distributed optimizer passes (its fp32 main
#: parameters); a mix is a model whose half-precision parameters get fp32 copies and others do not.
ALL_FP32 = (torch.float32, torch.float32)
MIXED = (torch.float32, torch.bfloat16)
ALL_BF16 = (torch.bfloat16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class LoadOutcome:
    """What ``load_state_dict`` did: the error it raised, or whether the loaded values arrived."""

    error: Optional[str]
    state_loaded: bool = False
    fp32_copies_loaded: bool = False
    fp32_params_untouched: bool = False


@contextlib.contextmanager
def on_device(device: str) -> Iterator[None]:
    from ..._checks._cpu_stand_in import cpu_megatron

    with cpu_megatron() if device == "cpu" else contextlib.nullcontext():
        yield


def build_optimizer(dtypes: Sequence[torch.dtype]) -> tuple[Any, list[torch.nn.Parameter]]:
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    generator = torch.Generator().manual_seed(7)
    params = [torch.nn.Parameter(torch.randn(4, 3, generator=generator).to(dtype)) for dtype in dtypes]
    optimizer = HybridDeviceOptimizer(
        params, offload_fraction=0.0, cpu_optimizer_cls=torch.optim.AdamW, gpu_optimizer_cls=torch.optim.AdamW,
        param_update_in_fp32=True, overlap_cpu_optimizer_d2h_h2d=False, pin_cpu_grads=False,
        pin_cpu_params=False, lr=0.01,
    )
    return optimizer, params


def trained_state_dict(optimizer: Any, params: Sequence[torch.nn.Parameter]) -> dict[str, Any]:
    """``optimizer.state_dict()`` with the per-parameter state a stepped optimizer of these parameters holds."""
    saved = optimizer.state_dict()
    generator = torch.Generator().manual_seed(11)
    saved["state"] = {
        index: {
            "step": torch.tensor(3.0),
            "exp_avg": torch.randn(param.shape, generator=generator),
            "exp_avg_sq": torch.rand(param.shape, generator=generator),
            "master_param": torch.randn(param.shape, generator=generator),
        }
        for index, param in enumerate(params)
    }
    return saved


def load(dtypes: Sequence[torch.dtype], device: str = "cpu") -> LoadOutcome:
    """Build the optimizer, load a trained state dict into it, and say what arrived."""
    with on_device(device):
        optimizer, params = build_optimizer(dtypes)
        saved = trained_state_dict(optimizer, params)
        before = [param.detach().clone() for param in params]
        try:
            optimizer.load_state_dict(saved)
        except Exception as exc:  # upstream's KeyError for an fp32 parameter is what the check reports
            return LoadOutcome(f"{type(exc).__name__}: {str(exc)[:120]}")
    expected = saved["state"]
    state_loaded = all(
        torch.equal(optimizer.state[param][key], expected[index][key])
        for index, param in enumerate(params) for key in ("exp_avg", "exp_avg_sq")
    )
    copies = optimizer.param_to_fp32_param
    fp32_copies_loaded = all(
        torch.equal(copies[param], expected[index]["master_param"])
        for index, param in enumerate(params) if param.dtype != torch.float32
    )
    fp32_params_untouched = all(
        param not in copies and torch.equal(param.detach(), before[index])
        for index, param in enumerate(params) if param.dtype == torch.float32
    )
    return LoadOutcome(None, state_loaded, fp32_copies_loaded, fp32_params_untouched)
