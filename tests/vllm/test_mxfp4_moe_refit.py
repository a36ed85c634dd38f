"""MXFP4 fused-MoE layers (gpt-oss and canonical ``mxfp4``) refitted through patchkit, on real vLLM.

The layer is vLLM's, with ``GptOssMxfp4Config`` or ``Mxfp4Config`` on vLLM's MARLIN backend:
``create_weights``, the weight loaders and ``process_weights_after_loading`` (Marlin repack and scale
permutation) are upstream's; on CPU, Marlin's device check and its CUDA repack op are stood in
(``patchkit.patches.vllm.refit._checks._mxfp4_moe.marlin_backend``, read it for exactly what). The proof for
every case is vLLM's own first load of the same checkpoint into a fresh model: after each refit every
kernel tensor equals that model's bit for bit, and keeps its object and storage.

Sizes: unpadded (Marlin's tiles) and padded the way vLLM pads gpt-oss on Marlin: gpt-oss-20b/120b's
own hidden size 2880 (-> 3072) with a small intermediate size that is padded too (192 -> 256), and
the real model's pair 2880/2880 (-> 3072/2944) with few experts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from nvfp4_helpers import (
    assert_same_kernel_state,
    dummy_started,
    kernel_state,
    native_reload,
    natively_loaded,
)
from patchkit.patches.vllm.refit import RefitError, UnsupportedQuantizationError, refit_weights
from patchkit.patches.vllm.refit._checks._mxfp4_moe import (
    GPT_OSS_HIDDEN,
    GPT_OSS_INTERMEDIATE,
    HIDDEN,
    INTERMEDIATE,
    KINDS,
    Mxfp4Moe,
    checkpoint,
    differing,
    first_load,
    gpt_oss_rank_slice,
    kernel_bytes,
    marlin_backend,
)
from refit_driver import dropped, halved, refit_alternately, retyped
from vllm_fixtures import installed

PATCH = "vllm.mxfp4_moe_refit"
#: (hidden, intermediate) of the checkpoint, by id
SIZES = {
    "unpadded": (HIDDEN, INTERMEDIATE),
    "gpt-oss-hidden-padded": (GPT_OSS_HIDDEN, 192),
}
#: the real gpt-oss pair, for the refit proof only (each first load of it takes a while on CPU)
GPT_OSS_SIZES = {"gpt-oss-20b-sizes": (GPT_OSS_HIDDEN, GPT_OSS_INTERMEDIATE)}


@pytest.fixture
def marlin(vllm_config: object) -> Iterator[None]:
    with marlin_backend("cpu"):
        yield


@pytest.fixture
def mxfp4_refit_patch(marlin: None) -> Iterator[None]:
    """``vllm.mxfp4_moe_refit`` applied for the test, reverted after."""
    with installed(PATCH):
        yield


def mxfp4_kinds() -> list[str]:
    """gpt-oss everywhere; ``Mxfp4MoEMethod`` where vLLM has it as the ``mxfp4`` method (0.29+; on 0.24
    ``Mxfp4Config`` builds the gpt-oss method, loaded per expert)."""
    return list(KINDS)


def items(weights: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    return iter(list(weights.items()))


def started(kind: str, start: str, vllm_config: object, sizes: tuple[int, int] = (HIDDEN, INTERMEDIATE)) -> Mxfp4Moe:
    if start == "dummy":
        return dummy_started(Mxfp4Moe(kind, *sizes), vllm_config)  # type: ignore[return-value]
    return first_load(kind, checkpoint(kind, 100, *sizes), "cpu", *sizes)


def assert_same_as_first_load(model: Mxfp4Moe, weights: dict[str, torch.Tensor]) -> None:
    reference = first_load(model.kind, weights, "cpu", model.hidden, model.intermediate)
    assert differing(model, kernel_bytes(reference)) == []


def identities(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    return {name: (id(p), p.data_ptr()) for name, p in model.named_parameters()}


@pytest.mark.parametrize("sizes", list(SIZES.values()), ids=list(SIZES))
@pytest.mark.parametrize("kind", mxfp4_kinds())
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_refits_equal_vllms_first_load_in_the_same_kernel_tensors(
    mxfp4_refit_patch: None, vllm_config: object, kind: str, start: str, sizes: tuple[int, int]
) -> None:
    model = started(kind, start, vllm_config, sizes)
    assert model.routed.quant_method.mxfp4_backend.name == "MARLIN"
    assert model.routed.w13_weight.dtype == torch.int32  # Marlin tiles, not the checkpoint's bytes
    refit_alternately(model, [checkpoint(kind, seed, *sizes) for seed in (1, 2)], 4,
                      lambda weights: assert_same_as_first_load(model, weights), identities)


_wrong_shape = halved("weight", dim=-1)
_wrong_dtype = retyped("weight", torch.bfloat16)
_missing_scale = dropped("weight_scale")


@pytest.mark.parametrize("sizes", list(SIZES.values()), ids=list(SIZES))
@pytest.mark.parametrize("kind", mxfp4_kinds())
@pytest.mark.parametrize("spoil", [_wrong_shape, _wrong_dtype, _missing_scale],
                         ids=["wrong-shape", "wrong-dtype", "missing-scale"])
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_a_bad_tensor_changes_nothing(
    mxfp4_refit_patch: None, vllm_config: object, kind: str, start: str,
    spoil: Callable[[dict[str, torch.Tensor]], str], sizes: tuple[int, int],
) -> None:
    model = started(kind, start, vllm_config, sizes)
    before = kernel_state(model)
    bad = checkpoint(kind, 3, *sizes)
    spoil(bad)
    with pytest.raises(RefitError) as caught:
        refit_weights(model, items(bad))
    assert caught.value.parameter is not None
    assert_same_kernel_state(model, before)
    # and the next good refit still works
    good = checkpoint(kind, 4, *sizes)
    refit_weights(model, items(good))
    assert_same_as_first_load(model, good)


def test_without_the_patch_a_refit_refuses_the_mxfp4_layer_by_name_and_changes_nothing(
    marlin: None, nvfp4_refit_patch: None
) -> None:
    """What the patch adds: without it the layer is not recorded, and a refit refuses it, naming the patch."""
    model = first_load("gpt_oss", checkpoint("gpt_oss", seed=1))
    before = kernel_state(model)
    with pytest.raises(RefitError, match=r"'experts.*GptOssMxfp4MoEMethod \(MXFP4 backend MARLIN\)\) was processed "
                       r"before patchkit recorded it.*vllm\.mxfp4_moe_refit"):
        refit_weights(model, items(checkpoint("gpt_oss", seed=2)))
    assert_same_kernel_state(model, before)


@pytest.mark.parametrize("sizes", list(GPT_OSS_SIZES.values()), ids=list(GPT_OSS_SIZES))
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_a_layer_of_gpt_oss_sizes_refits_to_vllms_first_load(
    mxfp4_refit_patch: None, vllm_config: object, start: str, sizes: tuple[int, int]
) -> None:
    """gpt-oss-20b/120b's own sizes, both padded on Marlin (hidden 2880 -> 3072, intermediate 2880 -> 2944):
    the refit used to refuse such a layer by name; it now equals vLLM's first load, after a dummy start's
    random padding too (the refit stages the zeros create_weights made)."""
    model = started("gpt_oss", start, vllm_config, sizes)
    moe = model.routed.quant_method.moe
    assert (moe.hidden_dim_unpadded, moe.hidden_dim) == (GPT_OSS_HIDDEN, 3072)
    assert (moe.intermediate_size_per_partition_unpadded, moe.intermediate_size_per_partition) == (2880, 2944)
    before = identities(model)
    weights = checkpoint("gpt_oss", 1, *sizes)
    refit_weights(model, items(weights))
    assert_same_as_first_load(model, weights)
    assert identities(model) == before


def test_a_padded_layer_demands_the_checkpoint_part_of_each_tensor(mxfp4_refit_patch: None) -> None:
    """A padded parameter is demanded in its checkpoint shape: a tensor short of it is refused by name with
    both shapes, and nothing changes."""
    sizes = SIZES["gpt-oss-hidden-padded"]
    model = first_load("gpt_oss", checkpoint("gpt_oss", 1, *sizes), "cpu", *sizes)
    before = kernel_state(model)
    bad = checkpoint("gpt_oss", 2, *sizes)
    bad["experts.w2_bias"] = bad["experts.w2_bias"][:, :2048].contiguous()
    with pytest.raises(RefitError, match=r"'w2_bias' \(\(4, 2880\) padded to \(4, 3072\) torch.bfloat16\) was not "
                       r"loaded in full: 8192 of 11520 elements") as caught:
        refit_weights(model, items(bad))
    assert caught.value.parameter == "w2_bias"
    assert_same_kernel_state(model, before)


@pytest.mark.parametrize("tp_rank", [0, 3])
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_a_gpt_oss_tp_rank_with_part_block_slices_refits_to_vllms_first_load(
    mxfp4_refit_patch: None, vllm_config: object, start: str, tp_rank: int
) -> None:
    """gpt-oss at TP 4: 2880 / 4 = 720 rows a rank, padded to 768, but gpt-oss's loader slices in 32-wide blocks:
    ranks 0-2 get 736 rows, rank 3 gets 672. The refit demands that slice and equals vLLM's first load of it
    (the rank is set on vLLM's own MoE parallel config: one process cannot run four ranks); a slice of the
    configured 720 rows is refused on rank 3, by name, changing nothing."""
    tp, hidden, per_rank = (4, tp_rank), GPT_OSS_HIDDEN, GPT_OSS_INTERMEDIATE // 4
    full = checkpoint("gpt_oss", 100, hidden, GPT_OSS_INTERMEDIATE)
    if start == "dummy":
        model = dummy_started(Mxfp4Moe("gpt_oss", hidden, per_rank, tp), vllm_config)
    else:
        model = first_load("gpt_oss", gpt_oss_rank_slice(full, *tp), "cpu", hidden, per_rank, tp)
    moe = model.routed.quant_method.moe
    assert (moe.intermediate_size_per_partition_unpadded, moe.intermediate_size_per_partition) == (720, 768)
    before = identities(model)
    weights = gpt_oss_rank_slice(checkpoint("gpt_oss", 1, hidden, GPT_OSS_INTERMEDIATE), *tp)
    assert weights["experts.w2_weight"].shape[-1] * 2 == (736 if tp_rank < 3 else 672)
    refit_weights(model, items(weights))
    reference = first_load("gpt_oss", weights, "cpu", hidden, per_rank, tp)
    assert differing(model, kernel_bytes(reference)) == []
    assert identities(model) == before
    if tp_rank == 3:
        kept = kernel_state(model)
        short = gpt_oss_rank_slice(checkpoint("gpt_oss", 2, hidden, GPT_OSS_INTERMEDIATE), *tp)
        short["experts.w2_weight"] = short["experts.w2_weight"][..., : 640 // 2].contiguous()
        with pytest.raises(RefitError, match=r"'w2_weight' \(\(4, 2880, 336\) padded to \(4, 3072, 384\)"):
            refit_weights(model, items(short))
        assert_same_kernel_state(model, kept)


def test_a_layer_on_another_backend_is_refused_by_name_and_changes_nothing(
    marlin: None, nvfp4_refit_patch: None
) -> None:
    """Backends other than MARLIN and TRITON stay refused, naming the backend: here Hopper's other one, FlashInfer's
    SM90 MXFP4 x BF16 kernel. Its processing needs FlashInfer's CUDA interleave, so a layer processed on Marlin is
    relabelled, as the method reports the backend (``mxfp4_backend``); unrecorded, as the patch leaves such a
    layer."""
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend

    sizes = SIZES["gpt-oss-hidden-padded"]
    model = first_load("gpt_oss", checkpoint("gpt_oss", 1, *sizes), "cpu", *sizes)
    model.routed.quant_method.mxfp4_backend = Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16
    before = kernel_state(model)
    with pytest.raises(UnsupportedQuantizationError,
                       match=r"GptOssMxfp4MoEMethod \(MXFP4 backend FLASHINFER_CUTLASS_MXFP4_BF16; a refit supports "
                       r"MARLIN, TRITON\)") as caught:
        refit_weights(model, items(checkpoint("gpt_oss", 2, *sizes)))
    assert "vllm.mxfp4_moe_refit" in caught.value.supported
    assert_same_kernel_state(model, before)


# --- vLLM's own layerwise reload (reload_weights, vLLM #32133): why MXFP4 is not declared native ---


def _natively_loaded(kind: str) -> Mxfp4Moe:
    return natively_loaded(Mxfp4Moe(kind), checkpoint(kind, seed=1))  # type: ignore[return-value]


@pytest.mark.parametrize("kind", mxfp4_kinds())
def test_native_reload_serves_good_mxfp4_weights_in_the_same_tensors(
    marlin: None, vllm_config: object, kind: str
) -> None:
    """Upstream does the good path: a reload equals a first load, in the same tensor objects and storage."""
    model = _natively_loaded(kind)
    before = identities(model)
    weights = checkpoint(kind, seed=2)
    native_reload(model, weights, vllm_config)
    assert_same_as_first_load(model, weights)
    assert identities(model) == before


@pytest.mark.parametrize("kind", mxfp4_kinds())
@pytest.mark.parametrize("spoil", [_wrong_shape, _missing_scale], ids=["wrong-shape", "missing-scale"])
def test_native_reload_takes_a_bad_mxfp4_tensor_without_an_error(
    marlin: None, vllm_config: object, kind: str, spoil: Callable[[dict[str, torch.Tensor]], str]
) -> None:
    """A half-width weight or a missing scale: no error, the layer is processed from what the reload's
    staging memory held (uninitialised where nothing was written); patchkit refuses both (above)."""
    model = _natively_loaded(kind)
    bad = checkpoint(kind, seed=2)
    spoil(bad)
    native_reload(model, bad, vllm_config)
    assert not any(p.is_meta for p in model.parameters())
