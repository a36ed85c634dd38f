"""``RadioModel.load_weights`` that loads RADIO's LayerScale (``ls1``/``ls2``) and fills what a checkpoint folds.

vLLM's RADIO encoder layers (``RadioVisionEncoderLayer``, InternViT's layer) multiply each residual branch by
the parameters ``ls1`` and ``ls2``, yet upstream's loader drops every ``model.blocks.<i>.ls1``/``ls2`` entry
of the checkpoint ("layer-scale entries that vLLM doesn't use"). The wrapper hands upstream every other
entry, loads the LayerScale entries itself through each parameter's ``weight_loader`` (``ls1`` as vLLM
names it, or ``ls1.gamma`` as timm's ``LayerScale`` module stores it), and sets every LayerScale parameter
that no checkpoint entry has ever written on this model to the config's ``initializer_factor``: the value
vLLM gives it at construction, which a dummy load (``load_format="dummy"``, the usual start of an RL
rollout engine) overwrites with random numbers.

"Ever" is per model: a weight sync that arrives in several ``load_weights`` calls does not reset a
LayerScale parameter an earlier call loaded. The names loaded or filled are returned with upstream's.
"""

from __future__ import annotations

import functools
import logging
import re
import weakref
from collections.abc import Callable
from typing import Any

import torch
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

logger = logging.getLogger(__name__)

LoadWeights = Callable[[Any, Any], set[str]]

#: A checkpoint's LayerScale entry: ``radio_model.model.blocks.<i>.ls1`` (or ``ls2``), optionally
#: ``.gamma`` (timm's ``LayerScale`` module).
_CHECKPOINT_LAYERSCALE = re.compile(r"radio_model\.model\.blocks\.(\d+)\.(ls[12])(?:\.gamma)?")

#: Per model, the LayerScale parameters a checkpoint entry has written (kept across ``load_weights`` calls).
_loaded_from_checkpoint: weakref.WeakKeyDictionary[torch.nn.Module, set[str]] = weakref.WeakKeyDictionary()


def layerscale_parameter(checkpoint_name: str) -> str | None:
    """The vLLM parameter a checkpoint's LayerScale entry belongs to (``model.encoder.layers.<i>.ls1``),
    or None for any other entry."""
    match = _CHECKPOINT_LAYERSCALE.fullmatch(checkpoint_name)
    return f"model.encoder.layers.{match[1]}.{match[2]}" if match else None


def _write(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    getattr(param, "weight_loader", default_weight_loader)(param, value)


def wrap_load_weights(original: LoadWeights) -> LoadWeights:
    """Upstream's ``load_weights`` on every entry but LayerScale, which is loaded (or filled) here."""

    @functools.wraps(original)
    def load_weights(self: Any, weights: Any) -> set[str]:
        entries = list(weights.items()) if isinstance(weights, dict) else list(weights)
        params = dict(self.named_parameters())
        layerscale: list[tuple[str, torch.Tensor]] = []
        others: list[tuple[str, torch.Tensor]] = []
        for name, tensor in entries:
            target = layerscale_parameter(name)
            if target is None:
                others.append((name, tensor))
            elif target in params:
                layerscale.append((target, tensor))
            else:  # a layer this model does not build (num_hidden_layers_override): upstream skips it too
                logger.debug("patchkit: RADIO LayerScale entry %s has no parameter here; skipped", name)
        loaded = set(original(self, others))

        written = _loaded_from_checkpoint.setdefault(self, set())
        with torch.no_grad():
            for target, tensor in layerscale:
                _write(params[target], tensor)
                loaded.add(target)
                written.add(target)
            factor = float(self.config.initializer_factor)
            folded = sorted(name for name in params if name.endswith((".ls1", ".ls2")) and name not in written)
            for name in folded:
                _write(params[name], torch.full_like(params[name], factor))
                loaded.add(name)
        if folded:
            logger.debug("patchkit: %d RADIO LayerScale parameters not in the checkpoint set to "
                         "initializer_factor %s", len(folded), factor)
        return loaded

    return load_weights
