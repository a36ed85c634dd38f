"""Ranks of the flex-dispatcher tests of ``megatron.moe_recompute_release`` (two spawned ranks, gloo, EP=2).

Each rank builds the tiny MoE GPT of the self-check's probe with ``moe_token_dispatcher_type='flex'``
(DeepEP or HybridEP through ``flex_ep_harness``), trains one step with the patch and one with
upstream's dispatchers, and reports what the step left behind: the model attributes through which a
tensor with autograd history is reached, the bytes reachable from the model, and the tensors each
MoE layer's dispatcher, its communication manager and its shared experts still hold.
"""

from __future__ import annotations

from typing import Any

PATCH = "megatron.moe_recompute_release"


def flex_config(backend: str, shared_expert_overlap: bool = False) -> dict[str, Any]:
    """``TransformerConfig`` fields selecting ``backend`` (``deepep``, ``hybridep``) for the flex dispatcher."""
    import dataclasses

    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {field.name for field in dataclasses.fields(TransformerConfig)}
    config: dict[str, Any] = {}
    if "moe_flex_dispatcher_backend" in fields:  # 0.16 and later
        config["moe_flex_dispatcher_backend"] = backend
    else:
        assert backend == "deepep", "0.14-0.15 have DeepEP only"
        config["moe_enable_deepep"] = True
    if shared_expert_overlap:
        config.update(moe_shared_expert_intermediate_size=32, moe_shared_expert_overlap=True)
    return config


def _one_step(backend: str, recompute: bool, overlap: bool) -> dict[str, Any]:
    from patchkit.patches.megatron.moe._checks._moe_recompute_probe import build_moe_gpt, step_tensors, train_step

    model = build_moe_gpt("flex", recompute=recompute, config=flex_config(backend, overlap))
    step = train_step(model)
    return {"loss": step.loss, "grads": step.grads, "holders": step.held.holders(), "bytes": step.held.bytes,
            "count": step.held.count, "step_tensors": step_tensors(model)}


def _case(backend: str, recompute: bool, overlap: bool) -> dict[str, Any]:
    import torch

    import patchkit
    from patchkit.selfcheck import upstream_behaviour

    with patchkit.applied(PATCH) as (status,):
        variant = status.to_dict()["variant"]
        patched = _one_step(backend, recompute, overlap)
        with upstream_behaviour(PATCH):
            upstream = _one_step(backend, recompute, overlap)
    same_loss = bool(torch.equal(patched.pop("loss"), upstream.pop("loss")))
    patched_grads, upstream_grads = patched.pop("grads"), upstream.pop("grads")
    unequal = sorted(name for name in upstream_grads
                     if name not in patched_grads or not torch.equal(patched_grads[name], upstream_grads[name]))
    return {"variant": variant, "patched": patched, "upstream": upstream, "same_loss": same_loss,
            "unequal_grads": unequal, "num_grads": len(upstream_grads)}


def flex_rank(rank: int, world_size: int, init_method: str, cases: list[tuple[str, bool, bool]]) -> dict[str, Any]:
    """Run ``cases`` ((backend, full recompute, shared-expert overlap) triples) on this rank; results by case."""
    from _multiprocess import init_rank
    from cpu_harness import cpu_megatron, destroy_parallel_state, initialize_parallel_state
    from flex_ep_harness import cpu_flex_ep
    from moe_harness import cpu_moe

    results: dict[str, Any] = {}
    with cpu_megatron():
        init_rank(rank, world_size, init_method)
        initialize_parallel_state(expert_model_parallel_size=world_size)
        try:
            with cpu_moe(), cpu_flex_ep():
                for backend, recompute, overlap in cases:
                    results[case_id(backend, recompute, overlap)] = _case(backend, recompute, overlap)
        finally:
            destroy_parallel_state()
    return results


def case_id(backend: str, recompute: bool, overlap: bool) -> str:
    """``deepep-full-recompute``, ``hybridep-no-recompute-shared-overlap``..."""
    overlapped = ["shared-overlap"] if overlap else []
    return "-".join([backend, "full-recompute" if recompute else "no-recompute", *overlapped])
