"""Keep ModelOpt quantizer state out of Megatron-Bridge's weight export (Bridge 0.2-0.3).

Derived from ``megatron/bridge/models/conversion/utils.py::persistent_buffers`` as called by
``model_bridge.py`` (``_megatron_global_param_names_all_pp_ranks`` and ``build_conversion_tasks``,
0.2.0rc6 and 0.3.1). ModelOpt keeps its quantizer state in persistent buffers
(``...linear_qkv.weight_quantizer._amax``). Bridge exports every persistent buffer, finds no HF
mapping for these, warns once per quantizer, and under expert parallelism fails earlier: its
expert renumbering reads the text after ``.weight`` as an integer. They are not weights of the
HF checkpoint, so the export skips them.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Iterable, Iterator, Tuple

import torch

_QUANTIZER = re.compile(r"(?:^|\.)[A-Za-z0-9]*_quantizer(?:\.|$)")


def is_quantizer_name(name: str) -> bool:
    """Whether ``name`` is (state of) a ModelOpt quantizer: a ``*_quantizer`` path component."""
    return _QUANTIZER.search(name) is not None


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
