"""Implementation of ``bridge.expert_local_to_global``: expert parameter names under expert parallelism.

Derived from ``megatron/bridge/models/conversion/model_bridge.py::_megatron_local_name_to_global``
(identical in 0.2.0rc6 and 0.3.1). Upstream renumbers expert weights from local to global only for the
grouped-GEMM naming (``experts.linear_fc1.weight3``). ModelOpt's quantizable MoE (``SequentialMLP`` of
local linears, as built by ``get_gpt_modelopt_spec``) names experts ``experts.local_experts.3.linear_fc1
.weight``: on expert-parallel rank r those names must become ``local_experts.{r * per_rank + 3}``, or
every EP rank exports its experts under rank 0's names.

0.4.0-0.4.1 are the same as 0.3. 0.4.2 takes the expert-parallel group from the model
(``model_bridge._get_ep_group``: the model's ``pg_collection.ep``, else the global group) for the
grouped naming; :func:`wrap_local_name_to_global_v042` uses that same function, so both namings agree
when a model carries its own process groups. 0.5 renumbers ``local_experts.N`` itself and sorts it
(the patch is ``native`` there).

Quantizer state (``...local_experts.3.linear_fc1.weight_quantizer._amax``) is numbered as its weight is,
pipeline stage and expert alike, as 0.5+ does: with ``ENABLE_BRIDGE_QUANT_MAPPING=1`` Bridge 0.4 exports
it, and a local number would put every EP rank's amax under rank 0's experts. The grouped experts' shared
quantizer (``experts.linear_fc1.weight_quantizer._amax``) has no expert number and keeps none.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from megatron.core import parallel_state

from ._expert_names import LOCAL_EXPERT
from ._skip_quantizer_params import is_quantizer_name, split_quantizer_name


def local_expert_to_global(param_name: str, num_experts: int, ep_rank: int, ep_size: int) -> str:
    """``...local_experts.{i}...`` on EP rank ``ep_rank`` of ``ep_size`` to the global expert number."""
    match = LOCAL_EXPERT.search(param_name)
    if match is None or ep_size <= 1:
        return param_name
    if num_experts % ep_size:
        raise ValueError(f"num_moe_experts={num_experts} is not divisible by the expert-parallel size {ep_size}")
    global_index = num_experts // ep_size * ep_rank + int(match.group(1))
    start, end = match.span(1)
    return param_name[:start] + str(global_index) + param_name[end:]


def _global_ep_group(models: Any) -> Any:
    """0.2-0.4.1: upstream renumbers with the global expert-parallel group, whatever the model."""
    return parallel_state.get_expert_model_parallel_group()


def _model_ep_group(models: Any) -> Any:
    """0.4.2: upstream's own choice of group (``_get_ep_group``); ``None`` means EP size 1."""
    from megatron.bridge.models.conversion import model_bridge

    return model_bridge._get_ep_group(models)


def wrap_local_name_to_global(original: Callable[..., str]) -> Callable[..., str]:
    """Upstream handles pipeline stages and grouped-GEMM experts; add the SequentialMLP naming."""
    return _wrap_local_name_to_global(original, _global_ep_group)


def wrap_local_name_to_global_v042(original: Callable[..., str]) -> Callable[..., str]:
    """As :func:`wrap_local_name_to_global`, with the EP group upstream takes from the model."""
    return _wrap_local_name_to_global(original, _model_ep_group)


def _wrap_local_name_to_global(original: Callable[..., str], ep_group_of: Callable[[Any], Any]) -> Callable[..., str]:
    @functools.wraps(original)
    def _megatron_local_name_to_global(models: Any, config: Any, param_name: str, vp_stage: Any = None) -> str:
        if is_quantizer_name(param_name):
            # Quantizer state is exported when ENABLE_BRIDGE_QUANT_MAPPING=1 (0.4; bridge.skip_quantizer_params
            # steps aside), so it must be numbered as its owner's weight is. Upstream parses the text after
            # '.weight' as an expert number and fails on '.weight_quantizer._amax': it renumbers the owning
            # module's path (pipeline stage), and the suffix is put back before the expert renumbering.
            owner, state = split_quantizer_name(param_name)
            name = original(models, config, owner, vp_stage) + state if owner else param_name
        else:
            name = original(models, config, param_name, vp_stage)
        if ".adapter." in name:  # upstream keeps adapters unsharded across EP ranks (0.3)
            return name
        group = ep_group_of(models)
        size = group.size() if group is not None else 1
        if size <= 1 or LOCAL_EXPERT.search(name) is None:
            return name
        return local_expert_to_global(name, int(config.num_moe_experts), group.rank(), size)

    return _megatron_local_name_to_global
