"""ModelOpt NVFP4 checkpoints, an independent quantiser and dequantiser, and tiny models built from vLLM layers.

Shared by the vLLM self-check (``patchkit doctor``) and ``tests/vllm`` (through ``nvfp4_helpers``).

The reference does not use vLLM: an NVFP4 weight is packed E2M1 nibbles (element 2i in the low
nibble, 2i+1 in the high one), each block of 16 along the input dimension scaled by an FP8 E4M3
``weight_scale``, the whole tensor by the float32 ``weight_scale_2``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
BLOCK = 16


def dequantize(weight: torch.Tensor, weight_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """[..., out, in/2] uint8 and [..., out, in/16] fp8 -> [..., out, in] float32.

    ``global_scale`` must broadcast against [..., out, in] (shape [1] for a linear layer,
    [experts, 1, 1] for MoE weights).
    """
    nibbles = torch.stack((weight & 0x0F, weight >> 4), dim=-1).flatten(-2).long()
    sign = torch.where(nibbles & 0x8 > 0, -1.0, 1.0)
    values = E2M1_VALUES[nibbles & 0x7] * sign
    scales = weight_scale.to(torch.float32).repeat_interleave(BLOCK, dim=-1)
    return values * scales * global_scale.to(torch.float32)


def export_nvfp4(prefix: str, weight: torch.Tensor, input_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A float ``[out, in]`` weight as a ModelOpt NVFP4 checkpoint layer (what a QAT export writes).

    Per-tensor ``weight_scale_2 = amax / (6 * 448)``; per block of 16, an FP8 E4M3 ``weight_scale``
    of ``block_amax / 6`` relative to it; values rounded to the nearest E2M1 magnitude and packed two
    per byte (element 2i in the low nibble), sign in bit 3.
    """
    rows = weight.detach().float().cpu()
    global_scale = (rows.abs().amax() / (6.0 * 448.0)).clamp(min=1e-12)
    blocks = rows.reshape(rows.shape[0], -1, BLOCK)
    block_scale = (blocks.abs().amax(-1, keepdim=True) / (6.0 * global_scale)).clamp(max=448.0)
    block_scale = block_scale.to(torch.float8_e4m3fn)
    scale = block_scale.float().clamp(min=2.0**-9) * global_scale
    scaled = (blocks / scale).reshape(rows.shape)
    codes = (scaled.abs().unsqueeze(-1) - E2M1_VALUES).abs().argmin(-1).to(torch.uint8)
    codes = codes | torch.where(scaled < 0, 0x8, 0).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return {
        f"{prefix}.weight": packed.contiguous(),
        f"{prefix}.weight_scale": block_scale.reshape(rows.shape[0], -1).contiguous(),
        f"{prefix}.weight_scale_2": global_scale.reshape(1).to(torch.float32),
        f"{prefix}.input_scale": torch.tensor([input_scale], dtype=torch.float32),
    }


def random_nvfp4(generator: torch.Generator, *shape_out_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed weight and block scales for a weight of logical shape ``shape_out_in``."""
    *lead, inp = shape_out_in
    weight = torch.randint(0, 256, (*lead, inp // 2), generator=generator, dtype=torch.uint8)
    weight_scale = (torch.rand(*lead, inp // BLOCK, generator=generator) * 4 + 0.25).to(torch.float8_e4m3fn)
    return weight, weight_scale


def linear_checkpoint(
    prefix: str, seed: int, out_features: int, in_features: int, weight_scale_2: float, input_scale: float
) -> dict[str, torch.Tensor]:
    """One ModelOpt NVFP4 linear layer as it appears in a checkpoint."""
    weight, weight_scale = random_nvfp4(torch.Generator().manual_seed(seed), out_features, in_features)
    return {
        f"{prefix}.weight": weight,
        f"{prefix}.weight_scale": weight_scale,
        f"{prefix}.weight_scale_2": torch.tensor([weight_scale_2], dtype=torch.float32),
        f"{prefix}.input_scale": torch.tensor([input_scale], dtype=torch.float32),
    }


def linear_reference(checkpoint: dict[str, torch.Tensor], prefix: str, x: torch.Tensor) -> torch.Tensor:
    w = dequantize(
        checkpoint[f"{prefix}.weight"],
        checkpoint[f"{prefix}.weight_scale"],
        checkpoint[f"{prefix}.weight_scale_2"],
    )
    return x @ w.T


def exact_activations(rows: int, in_features: int, seed: int = 7) -> torch.Tensor:
    """Activations that NVFP4 W4A4 quantisation leaves unchanged for a power-of-two input scale.

    Every value is on the E2M1 grid and every block of 16 holds a 6.0, so the block scale is
    exactly 1/input_scale and activation quantisation is the identity: the layer output must then
    equal the plain dequantise-then-matmul reference.
    """
    generator = torch.Generator().manual_seed(seed)
    magnitudes = E2M1_VALUES[torch.randint(0, 8, (rows, in_features), generator=generator)]
    signs = torch.where(torch.rand(rows, in_features, generator=generator) > 0.5, 1.0, -1.0)
    x = magnitudes * signs
    x.view(rows, in_features // BLOCK, BLOCK)[:, :, 0] = 6.0
    return x


def items(checkpoint: dict[str, torch.Tensor]) -> Iterable[tuple[str, torch.Tensor]]:
    return list(checkpoint.items())


def process_weights_after_loading(model: torch.nn.Module) -> None:
    """The quant-method loop of vLLM's ``model_loader.utils.process_weights_after_loading``.

    The upstream function also re-ties embeddings and finalises attention layers from a full
    ``ModelConfig``, which these single-layer models do not have.
    """
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    for _, module in model.named_modules():
        quant_method = getattr(module, "quant_method", None)
        if isinstance(quant_method, QuantizeMethodBase):
            quant_method.process_weights_after_loading(module)
            if hasattr(module, "update_param_tp_status"):
                module.update_param_tp_status()


# --- a two-layer NVFP4 model ----------------------------------------------------------------------

UP, DOWN = "up", "down"  # two layers: a failure in one must leave both serving old weights


def weights_a() -> dict[str, torch.Tensor]:
    return {
        **linear_checkpoint(UP, seed=0, out_features=32, in_features=64, weight_scale_2=0.01, input_scale=1.0),
        **linear_checkpoint(DOWN, seed=1, out_features=64, in_features=32, weight_scale_2=0.03, input_scale=1.0),
    }


def weights_b() -> dict[str, torch.Tensor]:
    # Different global scales (input scale 0.5: still exact for the test activations).
    return {
        **linear_checkpoint(UP, seed=2, out_features=32, in_features=64, weight_scale_2=0.02, input_scale=0.5),
        **linear_checkpoint(DOWN, seed=3, out_features=64, in_features=32, weight_scale_2=0.005, input_scale=0.5),
    }


class TwoLinears(torch.nn.Module):
    """The smallest vLLM-style model: two NVFP4 layers and vLLM's generic ``load_weights``."""

    def __init__(self) -> None:
        from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        quant_config = ModelOptNvFp4Config("NVFP4", True, None, [], 16)
        self.up = ColumnParallelLinear(64, 32, bias=False, quant_config=quant_config, prefix=UP,
                                       params_dtype=torch.float32)
        self.down = RowParallelLinear(32, 64, bias=False, quant_config=quant_config, prefix=DOWN,
                                      params_dtype=torch.float32)

    def load_weights(self, weights):  # the shape of every vLLM model's load_weights
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)


class Bf16Linears(torch.nn.Module):
    """Two bf16 NVFP4 layers (``up`` 128 -> 64, ``down`` 64 -> 128) of a checkpoint whose ``quant_algo`` is given.

    ``"W4A16_NVFP4"`` builds vLLM's W4A16 (Marlin) layers; ``"NVFP4"`` what vLLM builds for a W4A4
    checkpoint (or, with ``vllm.nvfp4_marlin_w4a16`` applied, W4A16 again). Marlin takes bf16/fp16 only.
    """

    def __init__(self, quant_algo: str = "W4A16_NVFP4", retain_for_gather: bool = False) -> None:
        from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        quant_config = ModelOptNvFp4Config(quant_algo, True, None, [], 16)
        self.quant_algo = quant_config.quant_method  # what the config made of the checkpoint's algorithm
        self.up = ColumnParallelLinear(128, 64, bias=False, quant_config=quant_config, prefix=UP,
                                       params_dtype=torch.bfloat16)
        self.down = RowParallelLinear(64, 128, bias=False, quant_config=quant_config, prefix=DOWN,
                                      params_dtype=torch.bfloat16)
        if retain_for_gather:  # as Qwen3 DSpark's Markov head sets it (vLLM 0.33)
            self.down._retain_weight_for_gather = True

    def load_weights(self, weights):
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)


def kernel_name(layer: torch.nn.Module) -> str:
    """The class name of the linear kernel vLLM chose for ``layer`` ("NoneType" when the method has none)."""
    return type(getattr(layer.quant_method, "kernel", None)).__name__


def loaded_model(weights: dict[str, torch.Tensor]) -> TwoLinears:
    model = TwoLinears()
    model.load_weights(items(weights))
    process_weights_after_loading(model)
    return model


def assert_serves(model: TwoLinears, weights: dict[str, torch.Tensor]) -> None:
    for name, in_features in ((UP, 64), (DOWN, 32)):
        x = exact_activations(5, in_features)
        out, _ = getattr(model, name)(x)
        torch.testing.assert_close(out, linear_reference(weights, name, x), rtol=1e-5, atol=1e-5)
