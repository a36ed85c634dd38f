"""A refit refuses, before any write, a layer whose quantization patchkit cannot refit.

The layers are vLLM's own (``RowParallelLinear``), built by vLLM's own quantization configs: online
FP8 per block (a bf16 checkpoint quantised at load, 128 x 128 blocks: ``OnlineQuantizationConfig`` with
``linear="fp8_per_block"``; per-tensor online FP8 has its own patch, ``vllm.fp8_online_refit``) and
compressed-tensors W4A16 int4 (``CompressedTensorsConfig.from_config``: ``CompressedTensorsWNA16`` on
``layer.scheme``; compressed-tensors NVFP4 has its own patch, ``vllm.compressed_tensors_nvfp4_refit``, and
tests in test_compressed_tensors_nvfp4_refit.py). Before this refusal a refit wrote the checkpoint tensors
into those layers' tensors without a word.
"""

from __future__ import annotations

import pytest
import torch
from fp8_helpers import items
from nvfp4_helpers import assert_same_kernel_state, kernel_state
from patchkit.patches.vllm.refit import RefitError, UnsupportedQuantizationError, refit, refit_weights

IN, OUT = 256, 128


def online_fp8_per_block_config() -> object:
    from vllm.config.quantization import QuantizationConfigArgs
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    return OnlineQuantizationConfig(QuantizationConfigArgs(linear="fp8_per_block"))


def compressed_tensors_w4a16_int4_config() -> object:
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
               "symmetric": True, "dynamic": False}
    return CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": [],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}},
    })


class Model(torch.nn.Module):
    """An unquantized layer ``plain`` (loaded in place by a refit) and a quantized layer ``quantized``."""

    def __init__(self, config: object) -> None:
        from vllm.model_executor.layers.linear import RowParallelLinear

        super().__init__()
        self.plain = RowParallelLinear(IN, OUT, bias=False, prefix="plain", params_dtype=torch.bfloat16)
        self.quantized = RowParallelLinear(IN, OUT, bias=False, quant_config=config, prefix="quantized",
                                           params_dtype=torch.bfloat16)

    def load_weights(self, weights: object) -> set[str]:
        loaded = set()
        for name, tensor in weights:  # type: ignore[attr-defined]
            param = self.get_parameter(name)
            param.weight_loader(param, tensor)
            loaded.add(name)
        return loaded


def checkpoint(model: Model, seed: int) -> dict[str, torch.Tensor]:
    """Random values for every parameter the model's layers registered, in their own dtypes and shapes."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, param in model.named_parameters():
        if param.dtype.is_floating_point and param.element_size() > 1:
            out[name] = torch.rand(param.shape, generator=generator).to(param.dtype)
        elif not param.dtype.is_floating_point and param.element_size() > 1:  # WNA16's int32 weight, int64 shape
            out[name] = torch.randint(1, 127, param.shape, generator=generator, dtype=param.dtype)
        else:
            out[name] = torch.randint(0, 127, param.shape, generator=generator, dtype=torch.uint8).view(param.dtype)
    return out


CONFIGS = {
    "online_fp8_per_block": online_fp8_per_block_config,
    "compressed_tensors_w4a16_int4": compressed_tensors_w4a16_int4_config,
}
METHODS = {
    "online_fp8_per_block": r"Fp8PerBlockOnlineLinearMethod",
    "compressed_tensors_w4a16_int4": r"CompressedTensorsLinearMethod \(scheme CompressedTensorsWNA16\)",
}


def loaded_model(kind: str) -> Model:
    model = Model(CONFIGS[kind]())
    model.load_weights(items(checkpoint(model, seed=1)))
    return model


@pytest.mark.parametrize("kind", CONFIGS)
def test_refit_weights_refuses_the_unsupported_layer_by_name_and_changes_nothing(
    kind: str, nvfp4_refit_patch: None, fp8_refit_patch: None, fp8_online_refit_patch: None
) -> None:
    model = loaded_model(kind)
    before = kernel_state(model)
    with pytest.raises(UnsupportedQuantizationError, match=rf"'quantized' uses {METHODS[kind]}.*supports") as caught:
        refit_weights(model, items(checkpoint(model, seed=2)))
    assert isinstance(caught.value, RefitError)
    assert caught.value.layer == "quantized"
    assert "vllm.nvfp4_refit" in caught.value.supported and "vllm.fp8_refit" in caught.value.supported
    assert "vllm.fp8_online_refit" in caught.value.supported
    assert_same_kernel_state(model, before)


@pytest.mark.parametrize("kind", CONFIGS)
def test_with_refit_refuses_before_the_block_runs(
    kind: str, nvfp4_refit_patch: None, fp8_refit_patch: None, fp8_online_refit_patch: None
) -> None:
    model = loaded_model(kind)
    before = kernel_state(model)
    ran = []
    with pytest.raises(UnsupportedQuantizationError, match="'quantized'"), refit(model):
        ran.append(True)
    assert not ran
    assert_same_kernel_state(model, before)
    # nothing is left prepared: an unquantized model refits afterwards
    plain = Model(None)
    plain.load_weights(items(checkpoint(plain, seed=3)))
    refit_weights(plain, items(checkpoint(plain, seed=4)))
    assert torch.equal(plain.plain.weight, checkpoint(plain, seed=4)["plain.weight"])
