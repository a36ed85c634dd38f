"""``patchkit.patches.bridge.export.export_shapes``: Bridge's export as (name, shape, dtype), shape-only.

The upstream truth is Bridge's own ``AutoBridge.export_hf_weights`` on the same tiny Llama (a Hugging Face
checkpoint read back by ``from_hf_pretrained``, built by Bridge's provider on CPU): names, shapes, dtypes
and order must be equal, on one rank; with tensor parallelism 2 (two gloo ranks), where the shapes are
the full unsharded ones although each rank holds half of the sharded weights, with no collective on a
group of more than one rank; and with pipeline parallelism 2, where each stage also yields the other's
tensors, exchanging only Bridge's shape records. Every tensor Bridge's mappings produce is on the meta
device.
Environments: modelopt-0.43-bridge-0.2, modelopt-0.47-bridge-0.3, modelopt-0.48-bridge-0.6.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed
from export_shapes_model import as_rows, build, conversion_tasks, save_checkpoint, upstream_export
from patchkit.patches.bridge.export import ExportedShape, _shape_only, export_shapes

#: The functions a shape-only block wraps while it is open; torch's own must be back after every run.
WRAPPED = {(torch.distributed, name) for name in _shape_only.COLLECTIVES + _shape_only.OBJECT_COLLECTIVES
           if hasattr(torch.distributed, name)} | {(torch, name) for name in _shape_only.ALLOCATORS}
#: Every HF tensor of the tiny Llama: 2 layers x 9 + embeddings, final norm, lm_head.
EXPORTED = 21


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def tiny_llama(megatron_cpu, checkpoint):
    return build(checkpoint)


@pytest.fixture
def torch_functions():
    """torch's functions before the test; the test fails if any is left replaced after it."""
    before = {(module, name): getattr(module, name) for module, name in WRAPPED}
    yield before
    left = [f"{module.__name__}.{name}" for (module, name), fn in before.items() if getattr(module, name) is not fn]
    assert left == [], f"left wrapped: {left}"


def _raise_at_call(tasks, number: int, error: Exception) -> None:
    """The ``number``-th conversion (1-based) of the export raises ``error`` (from inside a Bridge step)."""
    calls = []
    for mapping in {id(t.mapping): t.mapping for t in tasks if t is not None}.values():
        def megatron_to_hf(*args, __original=mapping.megatron_to_hf, **kwargs):
            calls.append(1)
            if len(calls) == number:
                raise error
            return __original(*args, **kwargs)

        mapping.megatron_to_hf = megatron_to_hf


def test_yields_bridges_names_shapes_and_dtypes_in_its_order(tiny_llama, torch_functions):
    bridge, model = tiny_llama
    expected = upstream_export(bridge, model)
    shapes = list(export_shapes(bridge, model))
    assert len(expected) == EXPORTED
    assert as_rows(shapes) == expected
    assert all(isinstance(s, ExportedShape) for s in shapes)
    assert "torch.bfloat16" in {dtype for _, _, dtype in expected}


def test_takes_prebuilt_tasks_and_leaves_them_as_they_were(tiny_llama, torch_functions):
    bridge, model = tiny_llama
    tasks = conversion_tasks(bridge, model)
    weights = [t.param_weight for t in tasks if t is not None]
    assert as_rows(export_shapes(bridge, model[0], conversion_tasks=tasks)) == upstream_export(bridge, model)
    assert [t.param_weight for t in tasks if t is not None] == weights
    assert all(w.device.type == "cpu" for w in weights)


def test_every_tensor_bridge_produces_is_meta(tiny_llama, torch_functions):
    bridge, model = tiny_llama
    tasks = conversion_tasks(bridge, model)
    produced: list[torch.device] = []
    for mapping in {id(t.mapping): t.mapping for t in tasks if t is not None}.values():
        def megatron_to_hf(weight, module, __original=mapping.megatron_to_hf):
            produced.append(weight.device)
            converted = __original(weight, module)
            produced.extend(t.device for t in converted.values() if isinstance(t, torch.Tensor))
            return converted

        mapping.megatron_to_hf = megatron_to_hf
    list(export_shapes(bridge, model, conversion_tasks=tasks))
    assert produced and {d.type for d in produced} == {"meta"}


def test_an_error_inside_bridges_export_restores_torch(tiny_llama, torch_functions):
    bridge, model = tiny_llama
    tasks = conversion_tasks(bridge, model)
    _raise_at_call(tasks, 3, KeyError("raised inside a conversion"))
    shapes = export_shapes(bridge, model, conversion_tasks=tasks)
    assert next(shapes) and next(shapes)
    with pytest.raises(KeyError, match="raised inside a conversion"):
        list(shapes)
    assert not _shape_only.active()
    received = [torch.zeros(2)]
    torch.distributed.all_gather(received, torch.ones(2))  # a real collective again (one rank: a copy)
    assert received[0].tolist() == [1.0, 1.0]
    assert torch.empty(2).device.type == "cpu"


def test_an_abandoned_iteration_restores_torch(tiny_llama, torch_functions):
    bridge, model = tiny_llama
    shapes = export_shapes(bridge, model)
    assert next(shapes).name
    assert all(getattr(module, name) is fn for (module, name), fn in torch_functions.items())
    shapes.close()
    assert not _shape_only.active()


def test_other_threads_keep_real_collectives_while_a_bridge_step_runs(tiny_llama, torch_functions):
    bridge, model = tiny_llama
    tasks = conversion_tasks(bridge, model)
    seen: dict[str, object] = {}

    def other_thread() -> None:
        received = [torch.zeros(2)]
        torch.distributed.all_gather(received, torch.ones(2))
        seen["gathered"] = received[0].tolist()
        seen["allocated_on"] = torch.empty(2).device.type

    mapping = next(t.mapping for t in tasks if t is not None)

    def megatron_to_hf(*args, __original=mapping.megatron_to_hf, **kwargs):
        if "gathered" not in seen:  # inside a Bridge step, shape-only in this thread
            seen["here"] = (_shape_only.active(), torch.empty(2).device.type)
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join(60)
        return __original(*args, **kwargs)

    mapping.megatron_to_hf = megatron_to_hf
    assert as_rows(export_shapes(bridge, model, conversion_tasks=tasks)) == upstream_export(bridge, model)
    assert seen == {"here": (True, "meta"), "gathered": [1.0, 1.0], "allocated_on": "cpu"}


def test_the_caller_s_code_between_two_tensors_runs_with_torch_untouched(tiny_llama, torch_functions):
    bridge, model = tiny_llama
    for _ in export_shapes(bridge, model):
        assert not _shape_only.active()
        assert torch.empty(1).device.type == "cpu"
        assert all(getattr(module, name) is fn for (module, name), fn in torch_functions.items())


def test_tensor_parallel_ranks_each_report_full_shapes_alone(checkpoint, tmp_path):
    """Two gloo ranks, TP=2: each rank runs ``export_shapes`` while its peer waits at a barrier."""
    import export_shapes_worker
    from _multiprocess import rendezvous, spawn_ranks

    results = spawn_ranks(export_shapes_worker.run, 2, (2, str(checkpoint), rendezvous(tmp_path / "rendezvous")),
                          timeout=600)
    for rank, result in enumerate(results):
        local = result["local_shapes"]
        # The ranks hold shards (QKV, fc1, fc2, embeddings split in two); the export is whole.
        assert local["decoder.layers.0.mlp.linear_fc1.weight"] == (128, 64), rank
        assert local["embedding.word_embeddings.weight"] == (64, 64), rank
        assert len(result["upstream"]) == EXPORTED
        assert result["shapes"] == result["upstream"], rank
        assert ("model.layers.0.mlp.gate_proj.weight", (128, 64), "torch.bfloat16") in result["shapes"]
        assert ("model.embed_tokens.weight", (128, 64), "torch.bfloat16") in result["shapes"]
        assert ("all_gather", 2) in result["upstream_calls"], rank  # Bridge's own export gathers over TP
        assert [call for call in result["calls"] if call[1] > 1] == [], rank
        assert result["devices"] == ["meta"], rank
        assert result["tasks_still_real"] and result["left_wrapped"] == [], rank
    assert results[0]["upstream"] == results[1]["upstream"]


def test_pipeline_stages_get_every_tensor_exchanging_only_shape_records(checkpoint, tmp_path):
    """Two gloo ranks, PP=2: the stages run ``export_shapes`` together; each yields the other's tensors too."""
    import export_shapes_worker
    from _multiprocess import rendezvous, spawn_ranks

    results = spawn_ranks(export_shapes_worker.run, 2,
                          (2, str(checkpoint), rendezvous(tmp_path / "rendezvous"), "pipeline"), timeout=600)
    object_collectives = set(_shape_only.OBJECT_COLLECTIVES)
    for rank, result in enumerate(results):
        owned = result["local_shapes"]
        assert sum(".layers." in name for name in owned) < sum(".layers." in n for n, _, _ in result["upstream"]), rank
        assert len(result["upstream"]) == EXPORTED
        assert result["shapes"] == result["upstream"], rank
        assert ("broadcast", 2) in result["upstream_calls"], rank  # Bridge's own export sends tensors across
        tensor_calls = [c for c in result["calls"] if c[1] > 1 and c[0] not in object_collectives]
        assert tensor_calls == [], rank
        assert ("all_gather_object", 2) in result["calls"], rank
        assert result["devices"] == ["meta"], rank
        assert result["tasks_still_real"] and result["left_wrapped"] == [], rank
