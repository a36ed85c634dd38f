"""What several Bridge self-checks share: a tiny Megatron GPT whose linears ModelOpt can quantize."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: Each linear of the tiny GPT and the tensor parallelism its weight is split with.
EXPECTED_PARALLELISM = {
    "decoder.layers.0.self_attention.linear_qkv": "column",
    "decoder.layers.0.self_attention.linear_proj": "row",
    "decoder.layers.0.mlp.linear_fc1": "column",
    "decoder.layers.0.mlp.linear_fc2": "row",
    "output_layer": "column",
}


@contextlib.contextmanager
def tiny_quantizable_gpt(device: str) -> Iterator[Any]:
    """The shared tiny GPT (no MTP) with ModelOpt's quantized classes swapped in for its linears.

    ``QuantModuleRegistry.convert`` is what ``mtq.quantize`` does to each module it quantizes (the
    class becomes ModelOpt's dynamic ``Quant<name>`` subclass, with weight/input quantizers); no
    calibration runs, so no NVFP4 kernel is needed. Each weight quantizer is given an amax, as
    calibration would, so the model holds the ``*_quantizer._amax`` buffers an export meets.
    """
    from modelopt.torch.quantization.nn import QuantModuleRegistry
    from patchkit.patches.megatron._checks._harness import megatron_on
    from patchkit.patches.megatron._checks._tiny_gpt import build_tiny_gpt

    with megatron_on(device):
        model = build_tiny_gpt(mtp_num_layers=None).to(device)
        for name in EXPECTED_PARALLELISM:
            module = model.get_submodule(name)
            QuantModuleRegistry.convert(module)
            module.weight_quantizer.amax = module.weight.detach().abs().amax()
        yield model
