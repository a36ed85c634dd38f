"""A failed refit changes nothing: NVFP4 layers and every tensor vLLM's loaders write in place (real vLLM, CPU).

``MixedModel`` puts next to two NVFP4 linears and an NVFP4 fused-MoE layer (staged by the refit)
what a real model also has and a refit writes in place: a vocabulary embedding, an RMSNorm, the
bias of an NVFP4 linear, an unquantized linear, an unquantized fused-MoE layer and a persistent
buffer. All are vLLM's layers with their own weight loaders (the RMSNorm and the buffer have
none: ``AutoWeightsLoader`` gives them ``default_weight_loader``). The unquantized MoE layer is
not processed: its processing prepacks with vLLM's compiled CPU ops (``vllm._C``), which the
PyPI wheel lacks; a refit writes its checkpoint-format parameters in place all the same.

Each test refits checkpoint A after a dummy start, then fails a refit of checkpoint B in one way,
and checks every parameter and buffer holds A's bytes at the same address, every loader attribute
is back as it was, and a later refit works.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Iterator

import pytest
import torch
from moe_helpers import MoEModel
from moe_helpers import checkpoint as moe_checkpoint
from nvfp4_helpers import assert_same_kernel_state, bits, items, kernel_state, linear_checkpoint
from patchkit.patches.vllm.refit import (
    RefitDeviceError,
    RefitError,
    abort_refit,
    prepare_refit,
    refit,
    refit_weights,
)
from patchkit.patches.vllm.refit import _impl as _refit_impl
from patchkit.patches.vllm.refit import _plain as _refit_plain
from patchkit.patches.vllm.refit import _writes as _refit_writes
from patchkit.patches.vllm.refit._loaders import set_loader

VOCAB, HIDDEN, INNER = 96, 64, 32


class MixedModel(torch.nn.Module):
    def __init__(self) -> None:
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        super().__init__()
        nvfp4 = ModelOptNvFp4Config("NVFP4", True, None, [], 16)
        self.embed = VocabParallelEmbedding(VOCAB, HIDDEN, params_dtype=torch.float32)
        self.norm = RMSNorm(HIDDEN)
        self.up = ColumnParallelLinear(HIDDEN, INNER, bias=True, quant_config=nvfp4, prefix="up",
                                       params_dtype=torch.float32)
        self.down = RowParallelLinear(INNER, HIDDEN, bias=False, quant_config=nvfp4, prefix="down",
                                      params_dtype=torch.float32)
        self.dense = ColumnParallelLinear(HIDDEN, INNER, bias=True, quant_config=None, prefix="dense",
                                          params_dtype=torch.float32)
        self.moe = MoEModel()
        self.plain_moe = MoEModel(quantized=False)
        self.register_buffer("table", torch.zeros(8), persistent=True)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)


def checkpoint(seed: int) -> list[tuple[str, torch.Tensor]]:
    """Plain tensors first and last, NVFP4 layers in between (as a real model's order has them)."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    weights = {"embed.weight": rand(VOCAB, HIDDEN), "norm.weight": rand(HIDDEN)}
    weights.update(linear_checkpoint("up", seed=seed, out_features=INNER, in_features=HIDDEN,
                                     weight_scale_2=0.01 * (seed + 1), input_scale=1.0 / seed))
    weights["up.bias"] = rand(INNER)
    weights.update(linear_checkpoint("down", seed=seed + 1, out_features=HIDDEN, in_features=INNER,
                                     weight_scale_2=0.03 * (seed + 1), input_scale=1.0 / seed))
    weights.update({f"moe.{n}": t for n, t in moe_checkpoint(seed, 0.01 * (seed + 1), 1.0 / seed).items()})
    weights.update({"dense.weight": rand(INNER, HIDDEN), "dense.bias": rand(INNER)})
    for expert in range(4):
        for proj, shape in (("gate_proj", (32, 64)), ("up_proj", (32, 64)), ("down_proj", (64, 32))):
            weights[f"plain_moe.experts.{expert}.{proj}.weight"] = rand(*shape)
    weights["table"] = rand(8)
    return list(weights.items())


A, B = checkpoint(1), checkpoint(2)


def process_nvfp4(model: torch.nn.Module) -> None:
    from patchkit.patches.vllm.refit._formats import format_of

    for module in model.modules():
        fmt = format_of(getattr(module, "quant_method", None), module)
        if fmt is not None and fmt.patch_id == "vllm.nvfp4_refit":
            module.quant_method.process_weights_after_loading(module)


def dummy_started() -> MixedModel:
    """vLLM's dummy loader, then processing of the NVFP4 layers (see the module docstring)."""
    from vllm.config import LoadConfig, get_current_vllm_config
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    model = MixedModel()
    DummyModelLoader(LoadConfig(load_format="dummy")).load_weights(model, get_current_vllm_config().model_config)
    process_nvfp4(model)
    return model


def loader_attributes(model: torch.nn.Module) -> dict[str, tuple[object, object, bool]]:
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {n: (t.__dict__.get("weight_loader"), t.__dict__.get("_weight_loader"), "weight_loader" in t.__dict__)
            for n, t in tensors.items()}


@pytest.fixture
def refitted_a(nvfp4_refit_patch: None, vllm_config: object) -> Iterator[MixedModel]:
    """A model that served checkpoint A after a dummy start; checks after the test that a good refit
    of B still works and serves B exactly as a model that never saw a failure does."""
    model = dummy_started()
    refit_weights(model, items(dict(A)))
    loaders = loader_attributes(model)
    yield model
    assert _refit_plain.GUARD_ATTR not in model.__dict__
    assert not _refit_writes.installed(), "the refit's write counting outlived it"
    assert loader_attributes(model) == loaders
    refit_weights(model, items(dict(B)))
    assert_serves_as_a_clean_refit(model, B)


def assert_serves_as_a_clean_refit(model: MixedModel, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Every parameter and buffer holds the bytes a model that never saw a failure holds after a
    refit of ``weights``."""
    clean = dummy_started()
    refit_weights(clean, items(dict(weights)))
    got, want = kernel_state(model), kernel_state(clean)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(bits(got[name][1]), bits(want[name][1])), name


def is_plain(name: str) -> bool:
    return not name.startswith(("up.", "down.", "moe.")) or name == "up.bias"


def test_the_model_has_plain_tensors_the_stream_writes_before_and_after_nvfp4_ones() -> None:
    names = [n for n, _ in B]
    assert is_plain(names[0]) and is_plain(names[-1])
    assert {n.split(".")[0] for n in names if is_plain(n)} == {"embed", "norm", "up", "dense", "plain_moe", "table"}


def test_every_tensor_of_a_refit_is_written(refitted_a: MixedModel) -> None:
    """Not vacuous: B differs from A in every parameter and buffer the model has."""
    state = kernel_state(refitted_a)
    refit_weights(refitted_a, items(dict(B)))
    for name, (_, data) in kernel_state(refitted_a).items():
        assert not torch.equal(bits(data), bits(state[name][1])), name
    refit_weights(refitted_a, items(dict(A)))  # back to A for the fixture's check


@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("fault", ["unknown-name", "wrong-shape"])
def test_a_bad_tensor_anywhere_leaves_the_previous_refit_exactly(refitted_a: MixedModel, position: str,
                                                                 fault: str) -> None:
    before = kernel_state(refitted_a)
    weights = list(B)
    index = {"first": 0, "middle": len(weights) // 2, "last": len(weights) - 1}[position]
    name, tensor = weights[index]
    if fault == "unknown-name":
        weights.insert(index + (position == "last"), ("no_such_layer.weight", tensor))
    else:
        weights[index] = (name, torch.zeros(tensor.numel() + 2, dtype=tensor.dtype))
    with pytest.raises(RefitError) as caught:
        refit_weights(refitted_a, iter(weights))
    assert "no_such_layer" in str(caught.value) if fault == "unknown-name" else caught.value.parameter
    assert_same_kernel_state(refitted_a, before)


@pytest.mark.parametrize("target", ["embed.weight", "dense.weight", "plain_moe.experts.routed_experts.w13_weight"])
def test_an_exception_inside_a_vllm_loader_after_it_wrote_is_undone(refitted_a: MixedModel, target: str) -> None:
    """vLLM's loader runs in full (writes its slice), then raises: what it wrote is put back."""
    param = refitted_a.get_parameter(target)
    original = param.weight_loader
    calls = []

    def failing_after_write(*args: object, **kwargs: object) -> object:
        original(*args, **kwargs)
        calls.append(1)
        raise RuntimeError("device lost while loading")

    param.weight_loader = failing_after_write
    before = kernel_state(refitted_a)
    try:
        with pytest.raises(RefitError, match="device lost"):
            refit_weights(refitted_a, items(dict(B)))
        assert calls
        assert_same_kernel_state(refitted_a, before)
    finally:
        param.weight_loader = original


def test_an_exception_inside_a_staged_nvfp4_loader_is_undone(refitted_a: MixedModel) -> None:
    """A meta tensor of the right shape and dtype (refused by the staged loader, below) is undone."""
    before = kernel_state(refitted_a)
    weights = [(n, torch.empty_like(t, device="meta") if n == "down.weight" else t) for n, t in B]
    with pytest.raises(RefitError):
        refit_weights(refitted_a, iter(weights))
    assert_same_kernel_state(refitted_a, before)


#: A staged NVFP4 parameter, an NVFP4 MoE expert's, and plain tensors vLLM's loaders write in place:
#: checkpoint name -> the layer and parameter the error names (the MoE layer is ``moe.experts`` on 0.24,
#: ``moe.experts.routed_experts`` from the MoE factory of 0.25 on).
META_TARGETS = {
    "down.weight": ("down", "weight"),
    "moe.experts.1.up_proj.weight_scale": ("moe.experts", "w13_weight_scale"),
    "embed.weight": ("embed", "weight"),
    "dense.bias": ("dense", "bias"),
}


@pytest.mark.parametrize("call", ["refit_weights", "with-refit"])
@pytest.mark.parametrize("target", list(META_TARGETS))
def test_a_meta_tensor_is_refused_by_name_and_the_refit_changes_nothing(refitted_a: MixedModel, target: str,
                                                                        call: str) -> None:
    """A CPU model given a refit tensor on the meta device (no data), last, after every other tensor of B
    was written: RefitDeviceError naming the layer and parameter, and every tensor keeps A's bytes."""
    before = kernel_state(refitted_a)
    weights = [(n, t) for n, t in B if n != target] + [(target, torch.empty_like(dict(B)[target], device="meta"))]
    with pytest.raises(RefitDeviceError) as caught:
        if call == "refit_weights":
            refit_weights(refitted_a, iter(weights))
        else:
            with refit(refitted_a):
                refitted_a.load_weights(iter(weights))
    layer, parameter = META_TARGETS[target]
    assert caught.value.layer in (layer, f"{layer}.routed_experts") and caught.value.parameter == parameter
    assert caught.value.device == "meta" and "meta" in caught.value.got
    assert isinstance(caught.value, RefitError)
    assert_same_kernel_state(refitted_a, before)


def test_a_meta_tensor_never_reaches_vllms_loader(refitted_a: MixedModel) -> None:
    """Refused before the parameter's own loader runs: vLLM's loader never sees it."""
    param = refitted_a.get_parameter("dense.bias")
    original, seen = param.weight_loader, []

    def recording(target: torch.Tensor, loaded_weight: torch.Tensor, *args: object) -> object:
        seen.append(loaded_weight.device.type)
        return original(target, loaded_weight, *args)

    param.weight_loader = recording
    weights = [(n, torch.empty_like(t, device="meta") if n == "dense.bias" else t) for n, t in B]
    try:
        with pytest.raises(RefitDeviceError):
            refit_weights(refitted_a, iter(weights))
    finally:
        param.weight_loader = original
    assert seen == []


class Interrupted(BaseException):
    """Not an Exception: what a KeyboardInterrupt or a framework's cancellation looks like."""


@pytest.mark.parametrize("where", ["stream", "plain-loader", "nvfp4-loader"])
def test_a_base_exception_mid_refit_leaves_the_previous_refit(refitted_a: MixedModel, where: str) -> None:
    before = kernel_state(refitted_a)
    half = len(B) // 2

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for i, (name, tensor) in enumerate(B):
            if where == "stream" and i == half:
                raise Interrupted
            yield name, tensor

    def interrupt(*_: object, **__: object) -> None:
        raise Interrupted

    original = refitted_a.dense.weight.weight_loader
    if where == "plain-loader":
        refitted_a.dense.weight.weight_loader = interrupt
    try:
        with pytest.raises(Interrupted):
            if where == "nvfp4-loader":
                with refit(refitted_a):
                    set_loader(refitted_a.down.weight, interrupt)  # the staged parameter's loader
                    refitted_a.load_weights(stream())
            else:
                refit_weights(refitted_a, stream())
    finally:
        refitted_a.dense.weight.weight_loader = original
    assert_same_kernel_state(refitted_a, before)


class ProducerError(ValueError):
    """What an exporter raises mid-stream (``QATExportError`` is a ValueError too)."""


def test_the_producers_own_error_reaches_the_caller_as_it_is(refitted_a: MixedModel) -> None:
    """An error raised by the weights iterable is not a loading error: before, it came back as a
    RefitError about the last tensor loaded ("a name the model does not have")."""
    before = kernel_state(refitted_a)
    error = ProducerError("weight 'down.weight' is not finite")

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        yield from B[: len(B) // 2]
        raise error

    with pytest.raises(ProducerError) as raised:
        refit_weights(refitted_a, stream())
    assert raised.value is error
    assert_same_kernel_state(refitted_a, before)


def test_a_write_the_counter_does_not_see_fails_the_refit_loudly(refitted_a: MixedModel) -> None:
    """Writes through ``out=`` are not counted (no vLLM loader makes them): such a loader must make
    the refit fail as "not loaded in full", never pass with whatever the staging held."""
    before = kernel_state(refitted_a)

    def writes_through_out(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        torch.bitwise_or(loaded_weight, 0, out=param.data)

    with pytest.raises(RefitError, match="'down'.*'weight'.*not loaded in full") as error:
        with refit(refitted_a):
            set_loader(refitted_a.down.weight, writes_through_out)
            refitted_a.load_weights(iter(B))
    assert (error.value.layer, error.value.parameter) == ("down", "weight")
    assert_same_kernel_state(refitted_a, before)


def test_staged_parameters_hold_storage_only_during_a_refit(refitted_a: MixedModel) -> None:
    states = [state for _, _, state in _refit_impl._recorded_layers(refitted_a)]
    staged = [param for state in states for param, _ in (state.staged_params or {}).values()]
    assert len(staged) == sum(len(state.checkpoint) for state in states) > 0
    assert all(param.numel() == 0 for param in staged)
    prepare_refit(refitted_a)
    try:
        assert all(param.numel() == state.checkpoint[name].numel
                   for state in states for name, (param, _) in state.staged_params.items())
    finally:
        abort_refit(refitted_a)
    assert all(param.numel() == 0 for param in staged)


def test_a_keyboard_interrupt_mid_stream_leaves_the_previous_refit(refitted_a: MixedModel) -> None:
    """A real SIGINT, delivered while vLLM's loaders run."""
    before = kernel_state(refitted_a)

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for i, (name, tensor) in enumerate(B):
            if i == len(B) // 2:
                os.kill(os.getpid(), signal.SIGINT)
            yield name, tensor

    with pytest.raises(KeyboardInterrupt):
        refit_weights(refitted_a, stream())
    assert_same_kernel_state(refitted_a, before)


def test_a_keyboard_interrupt_during_the_commit_lands_after_it(refitted_a: MixedModel,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT during the copies into the kernel tensors is held until the last copy: the model then
    serves B in full (the fixture compares it with a clean refit of B), never half A, half B."""
    commit, commits = _refit_impl._commit, []

    def interrupted_commit(*args: object) -> None:
        if not commits:
            os.kill(os.getpid(), signal.SIGINT)
        commits.append(1)
        commit(*args)

    handler = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(_refit_impl, "_commit", interrupted_commit)
    with pytest.raises(KeyboardInterrupt):
        refit_weights(refitted_a, items(dict(B)))
    assert len(commits) == 3  # up, down, moe: all committed before the interrupt
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is handler
    assert_serves_as_a_clean_refit(refitted_a, B)
    refit_weights(refitted_a, items(dict(A)))


def test_two_refits_then_a_failing_third_serves_the_second_exactly(refitted_a: MixedModel) -> None:
    refit_weights(refitted_a, items(dict(B)))
    after_b = kernel_state(refitted_a)
    broken = [(n, t) for n, t in A if n != "moe.experts.3.down_proj.weight_scale"]
    with pytest.raises(RefitError) as caught:
        refit_weights(refitted_a, iter(broken))
    assert caught.value.parameter == "w2_weight_scale"
    assert_same_kernel_state(refitted_a, after_b)
    refit_weights(refitted_a, items(dict(A)))


def test_only_written_plain_tensors_are_copied_and_copies_go_at_the_end(refitted_a: MixedModel) -> None:
    """The memory cost: one copy of each plain tensor the refit writes, dropped when it ends."""
    before = kernel_state(refitted_a)
    prepare_refit(refitted_a)
    guard = refitted_a.__dict__[_refit_plain.GUARD_ATTR]
    assert guard.copied_bytes() == 0
    weights = dict(B)
    refitted_a.load_weights([("norm.weight", weights["norm.weight"]), ("table", weights["table"])])
    refitted_a.load_weights([("norm.weight", weights["norm.weight"])])  # a second write: no second copy
    assert guard.copied_bytes() == (HIDDEN + 8) * 4
    abort_refit(refitted_a)
    assert guard.copied_bytes() == 0 and _refit_plain.GUARD_ATTR not in refitted_a.__dict__
    assert_same_kernel_state(refitted_a, before)


def test_tied_parameters_are_copied_once_and_restored(nvfp4_refit_patch: None, vllm_config: object) -> None:
    model = dummy_started()
    model.head = torch.nn.Module()
    model.head.weight = model.embed.weight  # tied, as lm_head and embed_tokens are in many models
    refit_weights(model, items(dict(A)))
    before = kernel_state(model)
    weights = [*B[:1], ("head.weight", B[0][1] * 2), *B[1:], ("no_such_layer.weight", B[0][1])]
    with pytest.raises(RefitError):
        refit_weights(model, iter(weights))
    assert_same_kernel_state(model, before)
