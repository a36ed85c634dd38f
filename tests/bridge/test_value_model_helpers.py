"""``bridge.value_model_helpers``: Bridge 0.5's value-model helpers in ``train_utils`` on Bridge 0.2 to 0.4.

Bridge 0.5 added ``LinearForLastLayer``, ``create_value_head_hook``, ``make_value_model`` and
``freeze_moe_router`` to ``megatron.bridge.training.utils.train_utils`` and lists the head as replicated in
``AutoMapping``'s registry; verl imports them from there and keeps copies for older Bridges. The same
assertions run on 0.2.0rc6, 0.3.1 and 0.4.2 (the patch's backport, reached through ``train_utils``) and on
0.6.2 (Bridge's own functions). On 0.6.2 every behaviour test also runs against the backport module
itself, and one test compares the two on the same model: the upstream truth for the backport.
Environments: modelopt-0.43-bridge-0.2, modelopt-0.47-bridge-0.3, modelopt-0.47-bridge-0.4,
modelopt-0.48-bridge-0.6.
"""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Callable

import pytest
import torch
from doctor_verdicts import bypassed_verdict, verdict_of
from packaging.version import Version
from patchkit.patches.bridge import _value_model_helpers as backport
from patchkit.patches.bridge._checks.value_model_helpers import (
    HELPER_NAMES,
    HIDDEN_SIZE,
    build_tiny_moe_gpt,
    exported_head,
    missing_helpers,
    values_of,
)
from patchkit.patches.megatron._checks._cpu_stand_in import cpu_moe
from patchkit.patches.megatron._checks._tiny_gpt import BATCH_SIZE, SEQ_LEN
from te_harness import bridge_import_context

import patchkit
from patchkit.doctor import FAILED, VERIFIED

PATCH = "bridge.value_model_helpers"
#: Bridge's own helpers from 0.5.0 (read from the wheels: 0.4.2 has none, 0.5.0, 0.5.1 and 0.6.2 the same code).
NATIVE = Version(importlib.metadata.version("megatron-bridge")) >= Version("0.5.0rc0")

with bridge_import_context():
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    try:
        from megatron.bridge.training.utils import train_utils
    except ImportError as not_importable:  # its training stack (datasets, megatron.training ...) not installed
        train_utils, WHY_NOT_IMPORTED = None, f"Bridge's train_utils does not import here: {not_importable}"

pytestmark = pytest.mark.usefixtures("patches_restored")
needs_train_utils = pytest.mark.skipif(train_utils is None, reason=globals().get("WHY_NOT_IMPORTED", ""))


def bridges_own_helpers() -> ModuleType:
    """Bridge 0.5+'s helpers, executed from the installed ``train_utils.py``: its classes and functions
    named below, its ``ModelList`` and ``ModelHook``, run with the module's own imports for them, where
    the whole module does not import (0.5+ also needs ``megatron.training`` and Energon)."""
    import megatron.bridge
    from megatron.core import tensor_parallel
    from megatron.core.transformer.module import MegatronModule

    source = Path(megatron.bridge.__file__).parent / "training" / "utils" / "train_utils.py"
    wanted = {"LinearForLastLayer", "create_value_head_hook", "make_value_model", "freeze_moe_router",
              "_ensure_model_list", "_freeze_parameter_if_present", "_register_linear_for_last_layer_mapping",
              "ModelList", "ModelHook"}
    tree = ast.parse(source.read_text(encoding="utf-8"))
    tree.body = [node for node in tree.body if getattr(node, "name", None) in wanted
                 or isinstance(node, ast.Assign) and {t.id for t in node.targets if isinstance(t, ast.Name)} & wanted]
    module = ModuleType("bridges_train_utils")
    module.__dict__.update(torch=torch, nn=torch.nn, tensor_parallel=tensor_parallel, MegatronModule=MegatronModule,
                           Callable=Callable)
    exec(compile(tree, str(source), "exec"), module.__dict__)
    assert {name for name in wanted if hasattr(module, name)} == wanted
    return module


@pytest.fixture(params=["train_utils", "backport", "bridges_own"] if NATIVE else ["train_utils"])
def helpers(request: pytest.FixtureRequest, applied: object) -> ModuleType:
    """Where the helpers are called from: ``train_utils`` with the patch applied (Bridge's own on 0.5+);
    on 0.5+ also the backport module and Bridge's own code from its source, so that the backport meets
    every assertion Bridge's own functions meet."""
    if request.param == "train_utils":
        if train_utils is None:
            pytest.skip(WHY_NOT_IMPORTED)
        return train_utils
    return backport if request.param == "backport" else bridges_own_helpers()


@pytest.fixture
def moe_on_cpu(megatron_cpu: None):
    with cpu_moe():
        yield


def _last_stage_of(monkeypatch: pytest.MonkeyPatch, stages: int, virtual_stages: int | None, rank: int) -> None:
    """Megatron's parallel state answering as ``rank`` of ``stages`` pipeline ranks, each holding
    ``virtual_stages`` chunks (chunk ``v`` of rank ``r`` is the last stage when ``r`` and ``v`` are the last)."""
    from megatron.core import parallel_state

    def is_last(ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
        if ignore_virtual or virtual_stages is None:
            return rank == stages - 1
        return rank == stages - 1 and vp_stage == virtual_stages - 1

    monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_world_size", lambda: stages)
    monkeypatch.setattr(parallel_state, "get_virtual_pipeline_model_parallel_world_size", lambda: virtual_stages)
    monkeypatch.setattr(parallel_state, "is_pipeline_last_stage", is_last)


def _chunks(count: int) -> list[torch.nn.Module]:
    chunks = [torch.nn.Module() for _ in range(count)]
    for chunk in chunks:
        chunk.output_layer = torch.nn.Identity()
    return chunks


# --- upstream pinned -----------------------------------------------------------------------------------


@needs_train_utils
def test_train_utils_has_the_helpers_from_bridge_0_5_only():
    """Without the patch, 0.2-0.4 lack every name and the registry entry; 0.5+ has them all."""
    assert missing_helpers() == ([] if NATIVE else list(HELPER_NAMES))
    assert ("LinearForLastLayer" in AutoMapping._MODULE_TYPE_REGISTRY["replicated"]) == NATIVE


_VERL_IMPORT = """
import sys
import patchkit
patchkit.apply_all()                                   # at start-up, before Bridge is imported
from te_harness import bridge_import_context, load_modelopt_megatron_plugin
load_modelopt_megatron_plugin()
with bridge_import_context():
    import megatron.bridge
    # verl/models/mcore/bridge.py's import, which falls back to its own copies on ImportError:
    from megatron.bridge.training.utils.train_utils import LinearForLastLayer, freeze_moe_router, make_value_model
from megatron.bridge.models.conversion.param_mapping import AutoMapping
assert "LinearForLastLayer" in AutoMapping._MODULE_TYPE_REGISTRY["replicated"]
(status,) = patchkit.status("bridge.value_model_helpers")
print(status.state.value, status.reason and status.reason.value)
"""


@needs_train_utils
@pytest.mark.slow
@pytest.mark.parametrize("disabled", [False, True], ids=["patchkit", "patch-disabled"])
def test_verls_import_from_train_utils_succeeds_with_the_patch(disabled: bool, monkeypatch: pytest.MonkeyPatch):
    """A fresh process: ``apply_all()`` at start-up, then verl's import. Before 0.5 it fails with the patch
    disabled and succeeds with it; on 0.5+ it succeeds either way (nothing installed)."""
    if disabled:
        monkeypatch.setenv("PATCHKIT_DISABLE", PATCH)
    else:
        monkeypatch.delenv("PATCHKIT_DISABLE", raising=False)
    done = subprocess.run([sys.executable, "-c", _VERL_IMPORT], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=300)
    if disabled and not NATIVE:
        assert done.returncode != 0
        assert "ImportError: cannot import name 'LinearForLastLayer'" in done.stderr, done.stderr[-2000:]
        return
    assert done.returncode == 0, done.stderr[-2000:]
    expected = "skipped native" if NATIVE else "skipped disabled" if disabled else "applied None"
    assert done.stdout.strip().splitlines()[-1] == expected


# --- behaviour: the same assertions on Bridge's own helpers and the backport ----------------------------


def test_hook_gives_a_one_stage_model_a_float32_value_per_token(helpers, moe_on_cpu):
    model = build_tiny_moe_gpt()
    assert helpers.make_value_model(HIDDEN_SIZE, False)(model) == [model]
    head = model.output_layer
    assert type(head).__name__ == "LinearForLastLayer" and isinstance(head, torch.nn.Linear)
    assert (head.in_features, head.out_features, head.bias) == (HIDDEN_SIZE, 1, None)
    assert head.sequence_parallel is False and not hasattr(head.weight, "sequence_parallel")
    values = values_of(model)
    assert values.shape == (BATCH_SIZE, SEQ_LEN, 1) and values.dtype == torch.float32
    values.sum().backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


def test_value_hook_and_router_freeze_compose_as_bridge_provider_hooks(helpers, moe_on_cpu):
    """As verl registers them (``provider.register_pre_wrap_hook``, value head first): Bridge's composed
    hook hands each hook what the previous one returned, so the value hook must return the chunks for
    ``freeze_moe_router`` to see the model (a hook returning ``None`` leaves the routers trainable)."""
    from megatron.bridge.models.model_provider import ModelProviderMixin

    stubs = {name: lambda self, *args, **kwargs: None for name in ModelProviderMixin.__abstractmethods__}
    provider = type("Provider", (ModelProviderMixin,), stubs)()
    provider.register_pre_wrap_hook(helpers.make_value_model(HIDDEN_SIZE, False))
    provider.register_pre_wrap_hook(helpers.freeze_moe_router)
    model = build_tiny_moe_gpt()
    assert provider.pre_wrap_hook([model]) == [model]
    assert isinstance(model.output_layer, helpers.LinearForLastLayer)
    frozen = sorted(name for name, parameter in model.named_parameters() if not parameter.requires_grad)
    assert frozen == ["decoder.layers.0.mlp.router.weight", "decoder.layers.1.mlp.router.weight"]


def test_hook_takes_one_module_or_a_list_and_returns_the_list(helpers, megatron_cpu):
    (chunk,) = _chunks(1)
    assert helpers.create_value_head_hook(HIDDEN_SIZE, False, output_size=3)([chunk]) == [chunk]
    assert chunk.output_layer.out_features == 3
    (chunk,) = _chunks(1)
    assert helpers.make_value_model(HIDDEN_SIZE, False)(chunk) == [chunk]
    assert isinstance(chunk.output_layer, helpers.LinearForLastLayer)


def test_hook_heads_only_the_last_virtual_stage_of_the_last_rank(helpers, monkeypatch):
    hook = helpers.make_value_model(HIDDEN_SIZE, False)
    _last_stage_of(monkeypatch, stages=2, virtual_stages=2, rank=1)
    first, last = chunks = _chunks(2)
    assert hook(chunks) == chunks
    assert isinstance(first.output_layer, torch.nn.Identity)
    assert isinstance(last.output_layer, helpers.LinearForLastLayer)
    _last_stage_of(monkeypatch, stages=2, virtual_stages=2, rank=0)
    chunks = _chunks(2)
    hook(chunks)
    assert all(isinstance(chunk.output_layer, torch.nn.Identity) for chunk in chunks)
    _last_stage_of(monkeypatch, stages=2, virtual_stages=None, rank=0)  # no virtual stages, not last
    (chunk,) = _chunks(1)
    hook(chunk)
    assert isinstance(chunk.output_layer, torch.nn.Identity)


def test_hook_refuses_a_chunk_count_unlike_the_virtual_stages(helpers, monkeypatch):
    _last_stage_of(monkeypatch, stages=2, virtual_stages=2, rank=1)
    with pytest.raises(ValueError, match="Got 1 model chunks and 2 post-process flags"):
        helpers.make_value_model(HIDDEN_SIZE, False)(_chunks(1))


def test_head_takes_the_output_layer_keywords_and_returns_float32(helpers):
    torch.manual_seed(0)
    head = helpers.LinearForLastLayer(HIDDEN_SIZE, 1, sequence_parallel=False).to(torch.bfloat16)
    hidden = torch.randn(SEQ_LEN, BATCH_SIZE, HIDDEN_SIZE, dtype=torch.bfloat16)
    values, bias = head(hidden, weight=torch.zeros(7, HIDDEN_SIZE), runtime_gather_output=True)
    assert bias is None
    assert values.dtype == torch.float32 and values.shape == (SEQ_LEN, BATCH_SIZE, 1)
    assert torch.equal(values, torch.nn.functional.linear(hidden, head.weight).float())  # not the weight passed


def test_sequence_parallel_head_gathers_the_sequence_without_a_reduced_gradient(helpers, monkeypatch):
    from megatron.core import tensor_parallel

    calls = []

    def gather_from_two_ranks(tensor: torch.Tensor, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs)
        return torch.cat([tensor, tensor])

    monkeypatch.setattr(tensor_parallel, "gather_from_sequence_parallel_region", gather_from_two_ranks)
    head = helpers.LinearForLastLayer(HIDDEN_SIZE, 1, sequence_parallel=True)
    assert head.sequence_parallel is True and head.weight.sequence_parallel is True
    values, _ = head(torch.randn(SEQ_LEN // 2, BATCH_SIZE, HIDDEN_SIZE))
    assert values.shape == (SEQ_LEN, BATCH_SIZE, 1) and values.dtype == torch.float32
    assert calls == [{"tensor_parallel_output_grad": False}]


def test_sequence_parallel_head_on_one_rank_equals_the_plain_head(helpers, megatron_cpu):
    torch.manual_seed(0)
    plain = helpers.LinearForLastLayer(HIDDEN_SIZE, 1, sequence_parallel=False)
    split = helpers.LinearForLastLayer(HIDDEN_SIZE, 1, sequence_parallel=True)
    split.load_state_dict(plain.state_dict())
    hidden = torch.randn(SEQ_LEN, BATCH_SIZE, HIDDEN_SIZE)
    assert torch.equal(split(hidden)[0], plain(hidden)[0])


def test_freeze_moe_router_freezes_the_routers_and_nothing_else(helpers, moe_on_cpu):
    model = build_tiny_moe_gpt()
    assert helpers.freeze_moe_router(model) == [model]
    frozen = sorted(name for name, parameter in model.named_parameters() if not parameter.requires_grad)
    assert frozen == ["decoder.layers.0.mlp.router.weight", "decoder.layers.1.mlp.router.weight"]


def test_freeze_moe_router_freezes_gates_and_biases_and_skips_what_is_absent(helpers):
    def parameter() -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.zeros(2))

    moe = SimpleNamespace(mlp=SimpleNamespace(router=SimpleNamespace(weight=parameter(), bias=parameter()),
                                              shared_experts=SimpleNamespace(gate_weight=parameter(), gate_bias=None)))
    dense = SimpleNamespace(mlp=SimpleNamespace(linear_fc1=SimpleNamespace(weight=parameter())))
    no_mlp = SimpleNamespace()
    chunk = SimpleNamespace(decoder=SimpleNamespace(layers=[moe, dense, no_mlp]))
    no_decoder = SimpleNamespace(embedding=SimpleNamespace(weight=parameter()))
    assert helpers.freeze_moe_router([chunk, no_decoder]) == [chunk, no_decoder]
    mlp = moe.mlp
    assert [mlp.router.weight.requires_grad, mlp.router.bias.requires_grad,
            mlp.shared_experts.gate_weight.requires_grad] == [False, False, False]
    assert dense.mlp.linear_fc1.weight.requires_grad and no_decoder.embedding.weight.requires_grad


def test_automapping_exports_the_value_head_whole(helpers, moe_on_cpu):
    model = build_tiny_moe_gpt()
    helpers.make_value_model(HIDDEN_SIZE, False)(model)
    head = model.output_layer
    mapping = AutoMapping("output_layer.weight", "score.weight")
    assert mapping._detect_parallelism_type(head) == "replicated"
    exported = exported_head(head)
    assert list(exported) == ["score.weight"] and torch.equal(exported["score.weight"], head.weight.detach())


# --- upstream truth on 0.5+: the backport beside Bridge's own helpers ------------------------------------


@pytest.mark.skipif(not NATIVE, reason="Bridge's own helpers exist from 0.5")
def test_backport_builds_the_same_value_model_as_bridges_own_helpers(megatron_cpu):
    bridges = bridges_own_helpers() if train_utils is None else train_utils
    with cpu_moe():
        theirs, ours = build_tiny_moe_gpt(seed=0), build_tiny_moe_gpt(seed=0)
        assert torch.equal(values_of(ours), values_of(theirs))  # the same model before the heads
        torch.manual_seed(1)
        bridges.make_value_model(HIDDEN_SIZE, False)(theirs)
        torch.manual_seed(1)
        backport.make_value_model(HIDDEN_SIZE, False)(ours)
        assert torch.equal(ours.output_layer.weight, theirs.output_layer.weight)
        assert torch.equal(values_of(ours), values_of(theirs))
    bridges.freeze_moe_router(theirs)
    backport.freeze_moe_router(ours)
    assert ([name for name, p in ours.named_parameters() if not p.requires_grad]
            == [name for name, p in theirs.named_parameters() if not p.requires_grad])


# --- the patch itself --------------------------------------------------------------------------------------


@needs_train_utils
@pytest.mark.skipif(NATIVE, reason="nothing is installed where Bridge has the helpers")
def test_revert_takes_the_names_and_the_registry_entry_away():
    with patchkit.applied(PATCH) as (record,):
        assert record.state.value == "applied"
        assert train_utils.make_value_model is backport.make_value_model
        assert "LinearForLastLayer" in AutoMapping._MODULE_TYPE_REGISTRY["replicated"]
    assert missing_helpers() == list(HELPER_NAMES)
    assert "LinearForLastLayer" not in AutoMapping._MODULE_TYPE_REGISTRY["replicated"]


@needs_train_utils
def test_value_model_helpers_check_is_verified(applied):
    verdict = verdict_of(PATCH)
    assert verdict.verdict == VERIFIED, verdict.message


@needs_train_utils
@pytest.mark.breaks("bridge.value_model_helpers")
def test_value_model_helpers_check_fails_without_the_helpers(applied, monkeypatch):
    def without_the_helpers() -> None:
        for name in HELPER_NAMES:
            monkeypatch.delattr(train_utils, name)

    # Not bypassable by upstream_behaviour (the patch registers a class name): on every release the
    # helpers are taken out of train_utils, which is where upstream's are and where the patch puts its own.
    verdict = bypassed_verdict(PATCH, True, without_the_helpers)
    assert verdict.verdict == FAILED
    assert f"expected the names {list(HELPER_NAMES)}, found {list(HELPER_NAMES)} missing" in verdict.message, \
        verdict.message
