"""Implementation of ``bridge.expert_sort_key``: the sort key of exported expert names (Bridge 0.2-0.4).

Derived from ``megatron/bridge/models/conversion/utils.py::extract_sort_key`` (identical in 0.2.0rc6
and 0.3.1): upstream's key only reads the grouped-GEMM naming's expert number
(``experts.linear_fc1.weight3``). ModelOpt's quantizable MoE names experts
``experts.local_experts.3.linear_fc1.weight``, and ``local_experts.10`` must sort after
``local_experts.2`` as expert 10 does after expert 2 in the grouped naming. 0.5 sorts it itself (the
patch is ``native`` there).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from ._expert_names import LOCAL_EXPERT

_LAYER = re.compile(r"layers\.(\d+)")
_GROUPED_EXPERT = re.compile(r"(?:bias|weight)(\d+)")


def extract_sort_key(param_name: str) -> tuple[list[int], str]:
    """Upstream's key, ``([layer, expert], name)``, reading the expert number in either naming."""
    numbers = []
    layer = _LAYER.search(param_name)
    if layer:
        numbers.append(int(layer.group(1)))
    expert = LOCAL_EXPERT.search(param_name) or _GROUPED_EXPERT.search(param_name)
    if expert:
        numbers.append(int(expert.group(1)))
    numbers += [-1] * (2 - len(numbers))
    return numbers[:2], param_name


def wrap_extract_sort_key(original: Callable[[str], Any]) -> Callable[[str], Any]:
    """Replace the call site's key; the original is kept by the engine for revert."""
    return functools.wraps(original)(extract_sort_key)
