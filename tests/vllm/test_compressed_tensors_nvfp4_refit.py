"""Compressed-tensors NVFP4 linear (W4A4, W4A16) and fused-MoE (W4A4) layers refitted through patchkit, on real vLLM.

The layers are vLLM's, with ``CompressedTensorsConfig`` for an ``nvfp4-pack-quantized`` checkpoint
(``patchkit.patches.vllm.refit._checks._ct_nvfp4_checkpoint``, the self-check's): ``create_weights``, the
weight loaders and ``process_weights_after_loading`` are upstream's. On CPU, W4A4 linear layers run
vLLM's NVFP4 emulation kernel and MoE layers its emulation backend (``cpu_nvfp4_kernels``); W4A16 layers
are processed by vLLM's Marlin kernel class with the CUDA repack stood in by a reshape
(``cpu_marlin_layout``). The proof for every case is vLLM's own first load of the same checkpoint into a
fresh model: after each refit, every kernel tensor equals that model's bit for bit, and sits at the
address it had before.

W4A16 fused MoE is not covered here: on CPU vLLM 0.33's ``select_nvfp4_moe_backend`` finds no backend
for NVFP4 weights with unquantised activations (``NotImplementedError: No NvFp4 MoE backend supports
the deployment configuration``: its emulation backend serves W4A4 only), so the layer cannot be built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from nvfp4_helpers import (
    assert_same_kernel_state,
    bits,
    dummy_started,
    items,
    kernel_state,
    native_reload,
    natively_loaded,
    process_weights_after_loading,
)
from patchkit.patches.vllm.refit import RefitError, UnsupportedQuantizationError, refit_weights
from patchkit.patches.vllm.refit._checks._ct_nvfp4_checkpoint import (
    FP8_KV_CACHE,
    HIDDEN,
    INTERMEDIATE,
    CtLinears,
    CtMoe,
    ct_nvfp4_config,
    linear_checkpoint,
    moe_checkpoint,
)
from refit_driver import dropped, halved, pointers, refit_alternately, retyped
from vllm_fixtures import installed

PATCH = "vllm.compressed_tensors_nvfp4_refit"
MOE_PATCH = "vllm.compressed_tensors_nvfp4_moe_refit"

KINDS = {
    "linear-w4a4": (lambda: CtLinears(a16=False), lambda seed: linear_checkpoint(False, seed)),
    "linear-w4a16": (lambda: CtLinears(a16=True), lambda seed: linear_checkpoint(True, seed)),
    "moe-w4a4": (lambda: CtMoe(a16=False), lambda seed: moe_checkpoint(False, seed)),
}


@pytest.fixture
def kernels(request: pytest.FixtureRequest, cpu_nvfp4_kernels: None) -> Iterator[None]:
    """What vLLM needs on CPU to build the layers of the test's ``kind``."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("kind") == "linear-w4a16":
        request.getfixturevalue("cpu_marlin_layout")
    yield


@pytest.fixture
def ct_nvfp4_refit_patch(kernels: None) -> Iterator[None]:
    """``vllm.compressed_tensors_nvfp4_refit`` and its MoE twin applied for the test, reverted after."""
    with installed(PATCH, MOE_PATCH):
        yield


def first_load(kind: str, checkpoint: dict[str, torch.Tensor]) -> torch.nn.Module:
    """vLLM's own first load: a fresh model, its loaders, its processing."""
    model = KINDS[kind][0]()
    model.load_weights(items(checkpoint))
    process_weights_after_loading(model)
    return model


def started(kind: str, start: str, vllm_config: object) -> torch.nn.Module:
    if start == "dummy":
        return dummy_started(KINDS[kind][0](), vllm_config)
    return first_load(kind, KINDS[kind][1](100))


def assert_same_as_first_load(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    ours = {**dict(model.named_parameters()), **dict(model.named_buffers()), **_tensor_attrs(model)}
    theirs = {**dict(reference.named_parameters()), **dict(reference.named_buffers()), **_tensor_attrs(reference)}
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert (ours[name].shape, ours[name].dtype) == (tensor.shape, tensor.dtype), name
        assert torch.equal(bits(ours[name]), bits(tensor)), name


def _tensor_attrs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Plain tensor attributes processing sets (the MoE's ``w13_input_scale``/``w2_input_scale``)."""
    return {f"{prefix}.{name}": value for prefix, module in model.named_modules()
            for name, value in vars(module).items() if isinstance(value, torch.Tensor) and not name.startswith("_")}


CASES = list(KINDS)


@pytest.mark.parametrize("kind", CASES)
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_refits_equal_vllms_first_load_in_the_same_kernel_tensors(
    ct_nvfp4_refit_patch: None, vllm_config: object, kind: str, start: str
) -> None:
    model = started(kind, start, vllm_config)
    refit_alternately(model, [KINDS[kind][1](seed) for seed in (1, 2)], 3,
                      lambda checkpoint: assert_same_as_first_load(model, first_load(kind, checkpoint)), pointers)


def test_the_moe_kernel_built_at_first_load_is_kept_and_reads_the_refitted_scales(
    ct_nvfp4_refit_patch: None, vllm_config: object
) -> None:
    model = started("moe-w4a4", "dummy", vllm_config)
    method = model.routed.quant_method
    kernel = method.moe_kernel
    refit_weights(model, items(moe_checkpoint(False, seed=1)))
    assert method.moe_kernel is kernel  # what a captured graph runs
    assert kernel.fused_experts.w1_scale_val.data_ptr() == model.routed.w13_weight_scale.data_ptr()


_wrong_shape = halved(".weight_packed", dim=0)
_wrong_dtype = retyped(".weight_packed", torch.bfloat16)
_missing_scale = dropped(".weight_global_scale")


@pytest.mark.parametrize("kind", CASES)
@pytest.mark.parametrize("spoil", [_wrong_shape, _wrong_dtype, _missing_scale],
                         ids=["wrong-shape", "wrong-dtype", "missing-scale"])
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_a_bad_tensor_changes_nothing(
    ct_nvfp4_refit_patch: None, vllm_config: object, kind: str, start: str,
    spoil: Callable[[dict[str, torch.Tensor]], str],
) -> None:
    model = started(kind, start, vllm_config)
    before = kernel_state(model)
    bad = KINDS[kind][1](3)
    spoil(bad)
    with pytest.raises(RefitError) as caught:
        refit_weights(model, items(bad))
    assert caught.value.parameter is not None
    assert_same_kernel_state(model, before)
    # and the next good refit still works
    good = KINDS[kind][1](4)
    refit_weights(model, items(good))
    assert_same_as_first_load(model, first_load(kind, good))


# --- without the patch ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", CASES)
def test_without_the_patch_a_refit_is_refused_by_name(
    kernels: None, nvfp4_refit_patch: None, kind: str
) -> None:
    """What a refit did before this patch: refuse the layer (UnsupportedQuantizationError before the
    patch existed; now a RefitError naming the patch that must record it), changing nothing."""
    model = first_load(kind, KINDS[kind][1](1))
    before = kernel_state(model)
    patch = MOE_PATCH if kind.startswith("moe") else PATCH
    with pytest.raises(RefitError, match=rf"processed before patchkit recorded it.*{patch}") as caught:
        refit_weights(model, items(KINDS[kind][1](2)))
    assert not isinstance(caught.value, UnsupportedQuantizationError)
    assert_same_kernel_state(model, before)


@pytest.mark.parametrize("kind", ["linear-w4a4", "moe-w4a4"])
def test_without_patchkit_a_second_load_is_refused_or_wrong(kernels: None, kind: str) -> None:
    """Processing renamed ``weight_packed`` and replaced the global scales: vLLM's loaders cannot take the
    checkpoint again."""
    model = first_load(kind, KINDS[kind][1](1))
    with pytest.raises(Exception) as caught:
        model.load_weights(items(KINDS[kind][1](2)))
        process_weights_after_loading(model)
        assert_same_as_first_load(model, first_load(kind, KINDS[kind][1](2)))
    assert not isinstance(caught.value, RefitError)


def test_other_compressed_tensors_schemes_pass_through_unrecorded(ct_nvfp4_refit_patch: None) -> None:
    """The linear method serves every compressed-tensors scheme: only NVFP4 layers are recorded (W4A16 int4
    here, ``CompressedTensorsWNA16``), and a refit still refuses the others."""
    from patchkit.patches.vllm.refit._state import CREATED_ATTR
    from test_refit_unsupported_quant import Model, compressed_tensors_w4a16_int4_config

    assert CREATED_ATTR in vars(CtLinears(a16=False).down)  # what the wrap keeps for an NVFP4 layer
    model = Model(compressed_tensors_w4a16_int4_config())
    assert CREATED_ATTR not in vars(model.quantized)
    with pytest.raises(UnsupportedQuantizationError, match=r"'quantized' uses .*CompressedTensorsWNA16"):
        refit_weights(model, iter([]))


# --- KV-cache scales beside compressed-tensors NVFP4 layers ----------------------------------------


class CtAttentionModel(torch.nn.Module):
    """A compressed-tensors NVFP4 projection and one attention layer with the checkpoint's FP8 KV cache
    (``kv_cache_scheme``: vLLM gives the attention layer ``CompressedTensorsKVCacheMethod``)."""

    def __init__(self) -> None:
        from test_kv_scale_refit import SelfAttention
        from vllm.model_executor.layers.linear import RowParallelLinear

        super().__init__()
        config = ct_nvfp4_config(a16=False, kv_cache_scheme=FP8_KV_CACHE)
        self.down = RowParallelLinear(INTERMEDIATE, HIDDEN, bias=False, quant_config=config, prefix="down",
                                      params_dtype=torch.bfloat16)
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].self_attn = SelfAttention(config)

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> set[str]:
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)  # type: ignore[no-any-return]


def _down_and_kv_scales(seed: int, k: float, v: float) -> dict[str, torch.Tensor]:
    down = {name: tensor for name, tensor in linear_checkpoint(False, seed).items() if name.startswith("down.")}
    attn = "layers.0.self_attn.attn"
    return {**down, f"{attn}.k_scale": torch.tensor(k), f"{attn}.v_scale": torch.tensor(v)}


def test_kv_scales_beside_compressed_tensors_layers_are_refitted_in_the_same_buffers(
    ct_nvfp4_refit_patch: None,
) -> None:
    from test_kv_scale_refit import scales
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsKVCacheMethod,
    )

    model = CtAttentionModel()
    attn = model.layers[0].self_attn.attn
    assert isinstance(attn.quant_method, CompressedTensorsKVCacheMethod)
    model.load_weights(items(_down_and_kv_scales(1, 0.5, 0.25)))
    process_weights_after_loading(model)
    kernel_ptrs = {n: p.data_ptr() for n, p in model.down.named_parameters()}
    # 0.24/0.29 leave the scales as parameters of the attention layer (``layer._k_scale = layer.k_scale``)
    ptrs = {n: t.data_ptr() for n, t in [*attn.named_buffers(), *attn.named_parameters()]}
    names = {n for n, _ in attn.named_parameters()}
    for step, (k, v) in enumerate(((2.0, 4.0), (1.5, 0.75))):
        weights = _down_and_kv_scales(step + 2, k, v)
        refit_weights(model, items(weights))
        assert scales(model) == (k, v, k, v)
        assert {n: t.data_ptr() for n, t in [*attn.named_buffers(), *attn.named_parameters()]} == ptrs
        reference = CtAttentionModel()
        reference.load_weights(items(weights))
        process_weights_after_loading(reference)
        for name, tensor in reference.down.named_parameters():
            assert torch.equal(bits(getattr(model.down, name)), bits(tensor)), name
        assert {n: p.data_ptr() for n, p in model.down.named_parameters()} == kernel_ptrs
    # a refit without KV scales keeps the ones in use and leaves no placeholder (zero points) behind
    refit_weights(model, items({n: t for n, t in _down_and_kv_scales(5, 0, 0).items() if "attn" not in n}))
    assert scales(model) == (1.5, 0.75, 1.5, 0.75)
    assert {n for n, _ in attn.named_parameters()} == names


# --- vLLM's own layerwise reload (reload_weights, vLLM #32133): why no range is declared native ---


def _natively_loaded(kind: str) -> torch.nn.Module:
    return natively_loaded(KINDS[kind][0](), KINDS[kind][1](1))


def test_native_reload_serves_good_compressed_tensors_nvfp4_linear_weights(
    kernels: None, vllm_config: object
) -> None:
    """Upstream does the good path for W4A4 linear layers: a reload equals a first load."""
    model = _natively_loaded("linear-w4a4")
    checkpoint = KINDS["linear-w4a4"][1](2)
    native_reload(model, checkpoint, vllm_config)
    assert_same_as_first_load(model, first_load("linear-w4a4", checkpoint))


def test_native_reload_with_a_wrong_shape_breaks_the_compressed_tensors_nvfp4_linear_layer(
    kernels: None, vllm_config: object
) -> None:
    """A refit tensor of the wrong shape: an error naming no layer, and the layer cannot serve any more."""
    model = _natively_loaded("linear-w4a4")
    bad = KINDS["linear-w4a4"][1](2)
    _wrong_shape(bad)
    with pytest.raises(Exception) as caught:
        native_reload(model, bad, vllm_config)
    assert "down" not in str(caught.value)
    assert any(p.is_meta for p in model.down.parameters())


@pytest.mark.parametrize("use_a16", [True, False])
def test_the_moe_method_tells_a_refit_which_input_scales_an_nvfp4a16_layer_lacks(
        monkeypatch: pytest.MonkeyPatch, use_a16: bool) -> None:
    """An NVFP4A16 MoE layer registers ``w13/w2_input_global_scale`` that its checkpoint does not carry;
    the refit skips them only if the method says ``use_a16``. vLLM 0.29+ keep the flag, 0.24-0.28 forget it
    and the patch keeps it: without that, a refit of such a layer demanded the missing scales (seen on an
    H100 with vLLM 0.24.0's Marlin kernels; ``test_compressed_tensors_nvfp4_refit_gpu.py``). Picking the
    backend needs CUDA (no CPU backend serves NVFP4 weights with bf16 activations), so that one call is
    stood in; the method's ``__init__`` is upstream's."""
    import importlib

    from patchkit.patches.vllm.refit._placeholders import unread_placeholders

    import patchkit

    module = importlib.import_module(
        "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
        "compressed_tensors_moe_w4a4_nvfp4")
    asked = []

    def select_nvfp4_moe_backend(**kwargs: object) -> tuple[object, None]:
        asked.append(kwargs["activation_key"])
        return NvFp4MoeBackend.MARLIN, None

    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend

    monkeypatch.setattr(module, "select_nvfp4_moe_backend", select_nvfp4_moe_backend)
    with patchkit.applied(MOE_PATCH):
        method = module.CompressedTensorsW4A4Nvfp4MoEMethod(None, "experts", use_a16=use_a16)
    assert (asked[0] is None) == use_a16  # upstream's own use of the flag
    expected = {"w13_input_global_scale", "w2_input_global_scale"} if use_a16 else set()
    assert unread_placeholders(method) == expected
