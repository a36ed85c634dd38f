"""A tiny vLLM ``RadioModel`` (two encoder layers, width 32) and a RADIO checkpoint for it.

Shared by the ``vllm.radio_layerscale_loader`` self-check and its tests. The model is vLLM's own class,
built from vLLM's own ``RadioConfig`` with its timm dimensions replaced by small ones; checkpoint names are
RADIO's (``radio_model.model.blocks.<i>....``), as a Nemotron VL model hands them to the encoder.
"""

from __future__ import annotations

from typing import Any

import torch

LAYERS, WIDTH = 2, 32
#: Not 1.0, so a filled value cannot be mistaken for an untouched constructor default.
INITIALIZER_FACTOR = 0.25


def tiny_radio_model(device: str = "cpu") -> Any:
    """vLLM's ``RadioModel`` of :data:`LAYERS` layers of width :data:`WIDTH`, ``initializer_factor``
    :data:`INITIALIZER_FACTOR`; needs vLLM's config and model-parallel state (``_cpu_stand_in.vllm_context``)."""
    from vllm.model_executor.models.radio import RadioModel
    from vllm.transformers_utils.configs.radio import RadioConfig

    config = RadioConfig(model_name="vit_base_patch16_224", image_size=32, patch_size=16,
                         initializer_factor=INITIALIZER_FACTOR)
    config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size = (
        WIDTH, LAYERS, 2, 2 * WIDTH)
    with torch.device(device):
        return RadioModel(config=config)


def layerscale_names() -> list[str]:
    """vLLM's names of the LayerScale parameters of :func:`tiny_radio_model`."""
    return [f"model.encoder.layers.{layer}.{scale}" for layer in range(LAYERS) for scale in ("ls1", "ls2")]


def randomise(model: Any, seed: int) -> None:
    """Every parameter set to random values, as vLLM's dummy load (``load_format="dummy"``) leaves them."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator).to(parameter.device) * 2 - 1)


def checkpoint(model: Any, *, layerscale: str | None, seed: int = 1) -> dict[str, torch.Tensor]:
    """A RADIO checkpoint with random values for every parameter of ``model``. ``layerscale``: None leaves
    the LayerScale entries out (folded), ``"plain"`` names them ``blocks.<i>.ls1``, ``"gamma"``
    ``blocks.<i>.ls1.gamma`` (timm's ``LayerScale`` module)."""
    generator = torch.Generator().manual_seed(seed)
    entries = {}
    for name, parameter in model.named_parameters():
        value = torch.rand(parameter.shape, generator=generator) + 2  # in [2, 3): unlike the dummy values
        if name.startswith("model.encoder.layers."):
            source = "model.blocks." + name.removeprefix("model.encoder.layers.")
        else:
            source = name
        if name.endswith((".ls1", ".ls2")):
            if layerscale is None:
                continue
            if layerscale == "gamma":
                source += ".gamma"
        entries[f"radio_model.{source}"] = value.to(parameter.device)
    return entries


def checkpoint_value(entries: dict[str, torch.Tensor], parameter: str) -> torch.Tensor:
    """The value ``entries`` give the vLLM parameter ``parameter`` (either LayerScale spelling)."""
    source = "radio_model." + parameter.replace("model.encoder.layers.", "model.blocks.")
    return entries[source] if source in entries else entries[source + ".gamma"]
