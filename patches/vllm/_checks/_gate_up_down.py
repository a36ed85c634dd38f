"""A quantized MLP's two linears as vLLM models build and load them, for the refit self-checks and tests.

``gate_up`` is a ``MergedColumnParallelLinear`` of two shards, ``down`` a ``RowParallelLinear``, both with
the format's ``quant_config`` and bf16 parameters. Checkpoint names are a model's: ``gate.*`` and ``up.*``
go into the fused ``gate_up`` as shards 0 and 1 (vLLM's ``stacked_params_mapping``), ``down.*`` as is, each
through its parameter's ``weight_loader``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class GateUpDown(torch.nn.Module):
    def __init__(self, quant_config: Any, *, hidden: int, intermediate: int,
                 down: tuple[int, int] | None = None) -> None:
        """``gate_up``: ``hidden`` in, ``intermediate`` out per shard; ``down``: (in, out) features,
        ``(intermediate, hidden)`` unless given."""
        from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

        super().__init__()
        down_in, down_out = down or (intermediate, hidden)
        self.gate_up = MergedColumnParallelLinear(hidden, [intermediate] * 2, bias=False, quant_config=quant_config,
                                                  prefix="gate_up", params_dtype=torch.bfloat16)
        self.down = RowParallelLinear(down_in, down_out, bias=False, quant_config=quant_config, prefix="down",
                                      params_dtype=torch.bfloat16)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """``gate.*``/``up.*`` into the fused ``gate_up`` shards 0/1, ``down.*`` as is (vLLM's stacking); a name
        with no parameter is a ``ValueError``."""
        params = dict(self.named_parameters())  # read now, as vLLM models do: a prepared refit has staged new ones
        loaded = set()
        for name, tensor in weights:
            prefix, _, suffix = name.partition(".")
            if prefix in ("gate", "up"):
                param = params[f"gate_up.{suffix}"]
                param.weight_loader(param, tensor, ("gate", "up").index(prefix))
            elif name in params:
                param = params[name]
                param.weight_loader(param, tensor)
            else:
                raise ValueError(f"no parameter for {name!r}")
            loaded.add(name)
        return loaded
