"""Router replay across real spawned ranks (gloo, CPU): PP=2, PP=2 x VPP=2, TP=2 with sequence
parallelism, EP=2, CP=2. Each scenario records in one forward, changes every router's expert
bias (so fresh routing differs), replays in another forward, and every rank checks its routing
maps equal the recorded ones. On the GPUs, TP=2 and EP=2 also compare with what one rank without
model parallelism records on the same weights and batch (EP=2: the one-rank model takes every expert
from the rank that holds it). Indices move between ranks only through ``patchkit.patches.megatron.router_replay``:
the pipeline gather / merge by layer number, the sequence-parallel gather and shard, CP unpack/pack.

Run as a script, this file is one rank (``python test_router_replay_distributed.py RANK WORLD PORT OUT``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

SCENARIOS = {
    "gloo": ("pp2", "vpp2", "tp2_sp", "cp2"),
    # EP=2 runs on the GPUs only: on gloo, megatron-core's all-to-all dispatcher hands torch tensors
    # as split sizes to all_to_all_single ("alltoall_base(): incompatible function arguments"); on
    # CUDA they are moved to the host first.
    "nccl": ("pp2", "vpp2", "tp2_sp", "cp2", "ep2"),
}
#: Largest |TP=2 or EP=2 loss - one-rank loss| per token (float32, per-token cross-entropy of about 5):
#: the row-parallel all-reduce sums partial products in another order than one matrix product does, and
#: under EP each expert multiplies another set of rows (the all-to-all regroups the tokens).
ONE_RANK_LOSS_BOUND = 1e-4
#: Seconds the ranks of one backend may take for all their scenarios.
RANKS_TIMEOUT_S = 900
HERE = Path(__file__).resolve().parent
_results_cache: dict[str, dict[int, dict]] = {}


def _two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


def _run_ranks(backend: str, out: Path) -> dict[int, dict]:
    from _multiprocess import rendezvous, run_rank_commands

    init_method = rendezvous(out)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    run_rank_commands([[sys.executable, str(Path(__file__).resolve()), str(rank), "2", backend, init_method, str(out)]
                       for rank in range(2)], timeout=RANKS_TIMEOUT_S, env=env)
    found = {}
    for rank in range(2):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} exited without results"
        found[rank] = json.loads(path.read_text())
    return found


@pytest.fixture
def results(request, tmp_path_factory):
    backend = request.param
    if backend == "nccl" and not _two_gpus():
        pytest.skip("needs two CUDA GPUs")
    if backend not in _results_cache:  # one launch of the ranks per backend
        _results_cache[backend] = _run_ranks(backend, tmp_path_factory.mktemp(f"replay_{backend}"))
    return _results_cache[backend]


CASES = [pytest.param("gloo", scenario, id=f"gloo-{scenario}") for scenario in SCENARIOS["gloo"]] + [
    pytest.param("nccl", scenario, id=f"nccl-{scenario}", marks=pytest.mark.gpu) for scenario in SCENARIOS["nccl"]
]


@pytest.mark.parametrize(("results", "scenario"), CASES, indirect=["results"])
def test_replay_reproduces_the_recorded_routing_on_every_rank(results, scenario):
    for rank in (0, 1):
        result = results[rank][scenario]
        assert result.get("error") is None, f"rank {rank}: {result.get('error')}"
        assert result["routers"] > 0
        assert result["fresh_differs"], "changing the expert bias must change fresh routing"
        assert result["replay_equal"], f"rank {rank}: replayed routing differs from the recorded one"
        assert result["layers_gathered"] == result["layers_expected"]
        assert result.get("loss_equal", True), f"rank {rank}: the replayed loss differs from the recorded one"
        if "one_rank_maps_equal" in result:  # TP=2, EP=2: what one rank without model parallelism computes
            assert result["one_rank_maps_equal"], f"rank {rank}: {scenario} routing differs from the one-rank routing"
            assert result["one_rank_loss_difference"] <= ONE_RANK_LOSS_BOUND, result["one_rank_loss_difference"]


# ------------------------------------------------------------------------------------------------
# The rank side.


def _run_rank(rank: int, world: int, backend: str, init_method: str, out: str) -> None:
    import contextlib

    import torch
    from _multiprocess import init_rank

    global DEVICE
    if backend == "nccl":
        torch.cuda.set_device(rank)
        DEVICE = torch.device("cuda", rank)
    init_rank(rank, world, init_method, backend)
    import traceback

    from cpu_harness import cpu_megatron
    from moe_harness import cpu_moe

    import patchkit

    patchkit.apply_all()
    results = {}
    harness = (cpu_megatron(), cpu_moe()) if backend == "gloo" else (contextlib.nullcontext(), contextlib.nullcontext())
    with harness[0], harness[1]:
        for scenario in SCENARIOS[backend]:
            try:
                results[scenario] = SCENARIO_FUNCTIONS[scenario](rank)
            except Exception:  # reported per scenario, the others still run
                results[scenario] = {"error": traceback.format_exc()[-4000:]}
            finally:
                _teardown()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


#: Where a rank's models and batches live: the CPU on gloo, its own GPU on NCCL (set by ``_run_rank``).
DEVICE = None


def _on_device(model):
    return model if DEVICE is None else model.to(DEVICE)


def _setup(**sizes):
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(**sizes)
    model_parallel_cuda_manual_seed(1234)


def _teardown():
    from megatron.core import parallel_state
    from patchkit.patches.megatron import router_replay as replay

    replay.reset()
    parallel_state.destroy_model_parallel()


def _maps_of(models):
    from replay_models import RoutingCapture

    return [RoutingCapture(model) for model in models]


def _take(captures):
    maps = []
    for capture in captures:
        maps.extend(capture.take())
    return maps


def _equal(a, b):
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _differs(a, b):
    import torch

    return any(not torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _pipeline_forward(chunks, batch, rank, world):
    """One micro-batch through the virtual stages in order: chunk v of rank 0, chunk v of rank 1, ..."""
    import torch
    from megatron.core import parallel_state
    from replay_models import forward_loss

    hidden = None
    for chunk in chunks:
        if not chunk.pre_process:
            shape = (batch.input_ids.shape[1], batch.input_ids.shape[0], chunk.config.hidden_size)
            hidden = torch.empty(shape, device=DEVICE)
            torch.distributed.recv(hidden, src=(rank - 1) % world)
        parallel_state.set_virtual_pipeline_model_parallel_rank(getattr(chunk, "vp_stage", None) or 0)
        chunk.set_input_tensor(hidden)
        output = forward_loss(chunk, batch)
        if not chunk.post_process:
            torch.distributed.send(output.detach().contiguous(), dst=(rank + 1) % world)


def _scenario_pipeline(rank, vpp):
    import torch
    from megatron.core import parallel_state
    from patchkit.patches.megatron import router_replay as replay
    from replay_models import build_tiny_moe, causal_batch, shift_expert_bias

    world = 2
    num_layers = 8 if vpp else 4
    _setup(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2 if vpp else None)
    common = dict(
        num_layers=num_layers, pipeline_model_parallel_size=2, pipeline_dtype=torch.float32,
        moe_layer_freq=[1, 0, 1, 1] * (num_layers // 4),
    )
    if vpp:
        common["virtual_pipeline_model_parallel_size"] = 2
    stages = range(2) if vpp else [None]
    chunks = []
    for vp in stages:
        first = rank == 0 and (vp in (None, 0))
        last = rank == 1 and (vp in (None, 1))
        if vp is not None:
            parallel_state.set_virtual_pipeline_model_parallel_rank(vp)
        chunk = _on_device(build_tiny_moe(pre_process=first, post_process=last, vp_stage=vp, seed=rank * 10 + (vp or 0),
                                          **common))
        chunk.vp_stage = vp
        chunks.append(chunk)
    batch = causal_batch() if DEVICE is None else causal_batch().to(DEVICE)
    scope = replay.for_model(chunks)
    captures = _maps_of(chunks)

    scope.set_action("record")
    _pipeline_forward(chunks, batch, rank, world)
    recorded_maps = _take(captures)
    merged = replay.gather_pipeline(scope.recorded())  # every stage's layers, global order
    expected = replay.moe_layer_numbers(chunks[0].config)

    for chunk in chunks:
        shift_expert_bias(chunk, seed=5 + rank)
    scope.clear()
    _pipeline_forward(chunks, batch, rank, world)
    fresh = _take(captures)

    scope.set_targets(merged)  # each stage takes its own layers
    scope.set_action("replay_forward")
    _pipeline_forward(chunks, batch, rank, world)
    replayed = _take(captures)
    return {
        "routers": len(scope.layers), "fresh_differs": _differs(fresh, recorded_maps),
        "replay_equal": _equal(replayed, recorded_maps), "layers_gathered": list(merged), "layers_expected": expected,
    }


def _norm_without_sequence_parallel():
    """Upstream's torch LayerNorm refuses ``sequence_parallel`` (TE's norm supports it); the norm is per
    token, so it is built from a copy of the config with the flag off. Everything else sees SP on."""
    import copy
    from unittest import mock

    from megatron.core.transformer import torch_norm

    original = torch_norm.WrappedTorchNorm.__new__

    def new(cls, config, *args, **kwargs):
        plain = copy.copy(config)
        plain.sequence_parallel = False
        return original(cls, plain, *args, **kwargs)

    return mock.patch.object(torch_norm.WrappedTorchNorm, "__new__", new)


def _tensors(model):
    """The model's tensors (weights and buffers) on the CPU, by name."""
    import torch

    return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()
            if isinstance(value, torch.Tensor)}


def _one_rank_state(model, shards):
    """The one-rank model's tensors from every expert-parallel rank's: local expert ``i`` of rank ``r``
    is global expert ``r * local + i``; every other tensor is this rank's own."""
    import re

    import torch

    expert = re.compile(r"local_experts\.(\d+)\.")
    local = len({found.group(1) for name in shards[0] if (found := expert.search(name))})
    state = {}
    for name in _tensors(model):
        found = expert.search(name)
        if found is None:
            state[name] = shards[torch.distributed.get_rank()][name]
            continue
        number = int(found.group(1))
        local_name = f"{name[:found.start()]}local_experts.{number % local}.{name[found.end():]}"
        state[name] = shards[number // local][local_name]
    return state


def _one_rank_reference(batch, expert_shards=None):
    """The same model and batch without model parallelism (data parallel over the two ranks): its
    recorded routing by layer and its loss, what one GPU computes. ``expert_shards``: every EP rank's
    initial weights, from which the one-rank model takes all its experts."""
    from patchkit.patches.megatron import router_replay as replay
    from replay_models import build_tiny_moe, forward_loss

    _teardown()
    _setup()
    model = _on_device(build_tiny_moe(seed=3))
    if expert_shards is not None:
        model.load_state_dict(_one_rank_state(model, expert_shards), strict=False)
    scope = replay.for_model(model)
    scope.set_action("record")
    loss = forward_loss(model, batch).detach()
    return dict(scope.recorded()), loss


def _scenario_simple(rank, *, sizes, overrides, pack_cp=False, compare_one_rank=False):
    """TP / EP / CP: one stage; indices go through the gather/unpack/pack path of the scenario."""
    import torch
    from megatron.core import parallel_state
    from patchkit.patches.megatron import router_replay as replay
    from replay_models import build_tiny_moe, causal_batch, forward_loss, shift_expert_bias

    _setup(**sizes)
    with _norm_without_sequence_parallel():
        model = _on_device(build_tiny_moe(seed=3, **overrides))
    expert_parallel = "expert_model_parallel_size" in sizes
    initial = _tensors(model) if compare_one_rank and expert_parallel else None  # before the bias shift
    batch = causal_batch(batch_size=1, seq_len=16, seed=7 + (rank if expert_parallel else 0))
    if DEVICE is not None:
        batch = batch.to(DEVICE)
    scope = replay.for_model(model)
    (capture,) = _maps_of([model])
    scope.set_action("record")
    recorded_loss = forward_loss(model, batch).detach()
    recorded_maps = capture.take()
    full = scope.recorded()  # sequence-parallel shards gathered: full rows on every TP rank
    if pack_cp:
        # Each CP rank's rows -> all ranks' rows -> per-sample -> this rank's rows again.
        group = parallel_state.get_context_parallel_group()
        layout = replay.thd_layout([32], seq_len=32, cp_size=2, num_experts=8, device=DEVICE)
        keys, stacked = replay.stack_layers(full)
        parts = [torch.empty_like(stacked) for _ in range(2)]
        torch.distributed.all_gather(parts, stacked.contiguous(), group=group)
        per_sample = replay.unpack(parts, layout)
        mine = replay.pack(per_sample, layout, cp_rank=parallel_state.get_context_parallel_rank())
        full = dict(zip(keys, mine.unbind(1), strict=True))
    shift_expert_bias(model, seed=9)
    scope.clear()
    forward_loss(model, batch)
    fresh = capture.take()
    scope.set_targets(full)  # cut back to this TP rank's shard under sequence parallelism
    scope.set_action("replay_forward")
    replayed_loss = forward_loss(model, batch).detach()
    replayed = capture.take()
    result = {
        "routers": len(scope.layers), "fresh_differs": _differs(fresh, recorded_maps),
        "replay_equal": _equal(replayed, recorded_maps), "layers_gathered": list(full), "layers_expected": [1, 2],
        "loss_equal": bool(torch.equal(replayed_loss, recorded_loss)),
    }
    if compare_one_rank and DEVICE is not None:
        # Weights come from the CPU initialisation (use_cpu_initialization): the TP shards are slices of
        # the one-rank weights, so the gathered routing must be the one-rank routing, and the loss equal
        # up to the order of the tensor-parallel reductions. On GPUs only: under the CPU stand-ins the
        # ranks do not come back from re-initialising the parallel state mid-scenario.
        shards = None
        if initial is not None:  # EP: the one-rank model holds all experts, gathered from both ranks
            shards = [None, None]
            torch.distributed.all_gather_object(shards, initial)
        reference_maps, reference_loss = _one_rank_reference(batch, shards)
        result["one_rank_maps_equal"] = sorted(reference_maps) == sorted(full) and all(
            torch.equal(full[layer].cpu(), reference_maps[layer].cpu()) for layer in reference_maps)
        result["one_rank_loss_difference"] = float((recorded_loss.float() - reference_loss.float()).abs().max())
    return result


SCENARIO_FUNCTIONS = {
    "pp2": lambda rank: _scenario_pipeline(rank, vpp=False),
    "vpp2": lambda rank: _scenario_pipeline(rank, vpp=True),
    "tp2_sp": lambda rank: _scenario_simple(
        rank, sizes=dict(tensor_model_parallel_size=2),
        overrides=dict(tensor_model_parallel_size=2, sequence_parallel=True), compare_one_rank=True,
    ),
    "cp2": lambda rank: _scenario_simple(rank, sizes=dict(context_parallel_size=2), overrides={}, pack_cp=True),
    "ep2": lambda rank: _scenario_simple(
        rank, sizes=dict(expert_model_parallel_size=2), overrides=dict(expert_model_parallel_size=2),
        compare_one_rank=True,
    ),
}


if __name__ == "__main__":
    _run_rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
