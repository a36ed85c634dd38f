"""KV-cache scales through a refit, on a real vLLM ``Attention`` with an FP8 KV cache (CPU).

``BaseKVCacheMethod.process_weights_after_loading`` copies ``k_scale``/``v_scale`` into the
``_k_scale``/``_v_scale`` buffers the attention kernels read, then deletes the checkpoint
parameters. A refit must keep the scales in use when it carries none, and update them in place
(same buffers) when it does.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from nvfp4_helpers import exact_activations, items, linear_checkpoint, linear_reference, process_weights_after_loading
from patchkit.patches.vllm.refit import RefitDeviceError, RefitError, refit

_model_numbers = itertools.count()  # attention layers register by name in vLLM's forward context


ATTN = "layers.0.self_attn.attn"


class SelfAttention(torch.nn.Module):
    def __init__(self, quant_config: object) -> None:
        from vllm.config import CacheConfig
        from vllm.model_executor.layers.attention import Attention

        super().__init__()
        self.attn = Attention(num_heads=2, head_size=64, scale=0.125, num_kv_heads=2,
                              cache_config=CacheConfig(cache_dtype="fp8"), quant_config=quant_config,
                              prefix=f"model{next(_model_numbers)}.{ATTN}")


class AttentionModel(torch.nn.Module):
    """An NVFP4 projection and one attention layer, named as in a ModelOpt checkpoint's model."""

    def __init__(self) -> None:
        from vllm.model_executor.layers.linear import ColumnParallelLinear
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        quant_config = ModelOptNvFp4Config("NVFP4", True, "FP8", [], 16)
        self.quant_config = quant_config  # AutoWeightsLoader maps ModelOpt KV-scale names with it
        self.proj = ColumnParallelLinear(64, 32, bias=False, quant_config=quant_config, prefix="proj",
                                         params_dtype=torch.float32)
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].self_attn = SelfAttention(quant_config)

    def load_weights(self, weights):
        from vllm.model_executor.models.utils import AutoWeightsLoader

        if self.quant_config.get_cache_scale_mapper() is None:
            # vLLM 0.24: ModelOpt has no cache-scale mapper; each model's load_weights remaps the
            # names itself (as LlamaModel does) and skips a scale the model has no parameter for.
            from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name

            params = dict(self.named_parameters())
            weights = [(name, w) for n, w in weights if (name := maybe_remap_kv_scale_name(n, params)) is not None]
        return AutoWeightsLoader(self).load_weights(weights)


def linear(seed: int) -> dict[str, torch.Tensor]:
    return linear_checkpoint("proj", seed=seed, out_features=32, in_features=64, weight_scale_2=0.01, input_scale=1.0)


def kv_scales(k: float, v: float) -> dict[str, torch.Tensor]:
    # ModelOpt's names; vLLM's cache-scale mapper sends them to self_attn.attn.{k,v}_scale.
    return {"layers.0.self_attn.k_proj.k_scale": torch.tensor(k), "layers.0.self_attn.v_proj.v_scale": torch.tensor(v)}


def loaded_model() -> AttentionModel:
    model = AttentionModel()
    model.load_weights(items({**linear(0), **kv_scales(0.5, 0.25)}))
    process_weights_after_loading(model)
    return model


def scales(model: AttentionModel) -> tuple[float, float, float, float]:
    attn = model.layers[0].self_attn.attn
    return attn._k_scale.item(), attn._v_scale.item(), attn._k_scale_float, attn._v_scale_float


def buffer_ptrs(model: AttentionModel) -> dict[str, int]:
    return {name: buf.data_ptr() for name, buf in model.layers[0].self_attn.attn.named_buffers()}


def assert_linear_serves(model: AttentionModel, weights: dict[str, torch.Tensor]) -> None:
    x = exact_activations(3, 64)
    torch.testing.assert_close(model.proj(x)[0], linear_reference(weights, "proj", x), rtol=1e-5, atol=1e-5)


def test_refit_without_kv_scales_keeps_the_scales_in_use(nvfp4_refit_patch: None) -> None:
    model = loaded_model()
    assert scales(model) == (0.5, 0.25, 0.5, 0.25)
    ptrs = buffer_ptrs(model)
    for seed in (1, 2, 3):
        with refit(model):
            model.load_weights(items(linear(seed)))
        assert_linear_serves(model, linear(seed))
        assert scales(model) == (0.5, 0.25, 0.5, 0.25)
        assert buffer_ptrs(model) == ptrs
        assert "k_scale" not in dict(model.layers[0].self_attn.attn.named_parameters())  # as upstream leaves it


def test_refit_with_kv_scales_updates_them_in_the_same_buffers(nvfp4_refit_patch: None) -> None:
    model = loaded_model()
    ptrs = buffer_ptrs(model)
    for step, (k, v) in enumerate(((2.0, 4.0), (0.5, 0.25), (1.5, 0.75))):
        with refit(model):
            model.load_weights(items({**linear(step + 1), **kv_scales(k, v)}))
        assert scales(model) == (k, v, k, v)
        assert buffer_ptrs(model) == ptrs
        assert_linear_serves(model, linear(step + 1))


def test_bad_kv_scale_is_refused_and_scales_kept(nvfp4_refit_patch: None) -> None:
    model = loaded_model()
    weights = {**linear(1), **kv_scales(2.0, 4.0), "layers.0.self_attn.k_proj.k_scale": torch.tensor([2.0, 3.0])}
    with pytest.raises(RefitError) as caught:
        with refit(model):
            model.load_weights(items(weights))
    assert (caught.value.layer, caught.value.parameter) == (ATTN, "k_scale")
    assert "(2,) torch.float32" in str(caught.value)
    assert scales(model) == (0.5, 0.25, 0.5, 0.25)
    assert_linear_serves(model, linear(0))


def test_a_kv_scale_on_the_meta_device_is_refused_and_scales_kept(nvfp4_refit_patch: None) -> None:
    """A KV-cache scale without data (meta), after the linear layer's tensors: refused by name, nothing changed."""
    model = loaded_model()
    weights = {**linear(1), **kv_scales(2.0, 4.0)}
    weights["layers.0.self_attn.v_proj.v_scale"] = torch.tensor(4.0, device="meta")
    with pytest.raises(RefitDeviceError) as caught:
        with refit(model):
            model.load_weights(items(weights))
    assert (caught.value.layer, caught.value.parameter, caught.value.device) == (ATTN, "v_scale", "meta")
    assert scales(model) == (0.5, 0.25, 0.5, 0.25)
    assert_linear_serves(model, linear(0))


def test_without_patchkit_refitted_kv_scales_are_silently_dropped(cpu_nvfp4_kernels: None) -> None:
    """Processing deleted the scale parameters; vLLM's loader skips the now-unknown names quietly."""
    model = loaded_model()
    loaded = model.load_weights(items(kv_scales(2.0, 4.0)))
    attn = model.layers[0].self_attn.attn
    attn.quant_method.process_weights_after_loading(attn)  # upstream: "no weights to process"
    assert not any(name.endswith("_scale") for name in loaded)
    assert scales(model) == (0.5, 0.25, 0.5, 0.25)  # the 2.0 / 4.0 never arrive
