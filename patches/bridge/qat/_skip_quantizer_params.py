"""Keep ModelOpt quantizer state out of Megatron-Bridge's weight export (Bridge 0.2-0.3).

Derived from ``megatron/bridge/models/conversion/utils.py::persistent_buffers`` as called by
``model_bridge.py`` (``_megatron_global_param_names_all_pp_ranks`` and ``build_conversion_tasks``,
0.2.0rc6 and 0.3.1). ModelOpt keeps its quantizer state in persistent buffers
(``...linear_qkv.weight_quantizer._amax``). Bridge exports every persistent buffer, finds no HF
mapping for these, warns once per quantizer, and under expert parallelism fails earlier: its
expert renumbering reads the text after ``.weight`` as an integer. They are not weights of the
HF checkpoint, so the export skips them.

From 0.4 Bridge can export that state itself: with ``ENABLE_BRIDGE_QUANT_MAPPING=1`` its
``MegatronMappingRegistry`` adds ``*.weight_quantizer._amax`` / ``*.input_quantizer._amax`` mappings
(``mapping_registry.py``, read when a registry is built). Dropping the buffers then would silently
lose what the user asked Bridge to export, so :func:`wrap_persistent_buffers_v04` steps aside.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Callable, Iterable, Iterator, Tuple

import torch

logger = logging.getLogger(__name__)
#: Bridge 0.4+'s switch for its own quantizer-state export (``mapping_registry.py``).
BRIDGE_QUANT_MAPPING = "ENABLE_BRIDGE_QUANT_MAPPING"
_QUANTIZER = re.compile(r"(?:^|\.)[A-Za-z0-9]*_quantizer(?:\.|$)")


def is_quantizer_name(name: str) -> bool:
    """Whether ``name`` is (state of) a ModelOpt quantizer: a ``*_quantizer`` path component."""
    return _QUANTIZER.search(name) is not None


def split_quantizer_name(name: str) -> tuple[str, str]:
    """``owner.weight_quantizer._amax`` -> (``owner``, ``.weight_quantizer._amax``); ("", name) without owner."""
    match = _QUANTIZER.search(name)
    if match is None:
        return name, ""
    if match.start() == 0:
        return "", name
    return name[: match.start()], name[match.start():]


def wrap_persistent_buffers(
    original: Callable[[torch.nn.Module], Iterable[Tuple[str, torch.Tensor]]],
) -> Callable[[torch.nn.Module], Iterator[Tuple[str, torch.Tensor]]]:
    """Upstream's buffers, less those of quantizer modules."""

    @functools.wraps(original)
    def persistent_buffers(model: torch.nn.Module) -> Iterator[Tuple[str, torch.Tensor]]:
        for name, buffer in original(model):
            if not is_quantizer_name(name):
                yield name, buffer

    return persistent_buffers


def bridge_quant_mapping_enabled() -> bool:
    """Whether Bridge's own quantizer mappings are on, parsed as Bridge parses it (``int(value)``).

    A value Bridge cannot parse makes Bridge raise when it builds a mapping registry; here it counts
    as on, so nothing is dropped silently in the meantime.
    """
    value = os.environ.get(BRIDGE_QUANT_MAPPING, "0")
    try:
        return bool(int(value))
    except ValueError:
        return True


def wrap_persistent_buffers_v04(
    original: Callable[[torch.nn.Module], Iterable[Tuple[str, torch.Tensor]]],
) -> Callable[[torch.nn.Module], Iterator[Tuple[str, torch.Tensor]]]:
    """As :func:`wrap_persistent_buffers`, unless ``ENABLE_BRIDGE_QUANT_MAPPING`` asks Bridge to export them."""
    skipping = wrap_persistent_buffers(original)

    @functools.wraps(original)
    def persistent_buffers(model: torch.nn.Module) -> Iterator[Tuple[str, torch.Tensor]]:
        if bridge_quant_mapping_enabled():
            logger.debug("patchkit: %s is set: quantizer state is left to Bridge's export", BRIDGE_QUANT_MAPPING)
            yield from original(model)
        else:
            yield from skipping(model)

    return persistent_buffers
