"""Megatron-Bridge support for ModelOpt QAT models: the public helper, and where its patches are.

Each behaviour is its own patch, declared in its own module, so it can be switched off alone
(``bridge.modelopt_layer_spec``, ``bridge.quant_linear_parallelism``, ``bridge.skip_quantizer_params``,
``bridge.expert_local_to_global``, ``bridge.expert_sort_key``);
the ranges are the Bridge releases whose sources were read and whose tests ran (0.2.0rc6, 0.3.1,
0.4.2, 0.5.1, 0.6.2; 0.4.0, 0.5.0 and 0.6.0 read from their wheels). Each ``native`` variant names
what upstream does instead, and ``tests/bridge`` shows upstream doing it. Facts:
``shared/research/upstream-drift.md`` section 4 and ``frameworks-2026-11.md``; why each is needed:
the implementation modules' docstrings.

This module declares no patch; its one public helper is reached lazily (PEP 562), so importing it
stays cheap:
:func:`use_modelopt_layer_spec` (the fresh-QAT switch, the same call on every Bridge release).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._modelopt_layer_spec_v03 import use_modelopt_layer_spec

__all__ = ["use_modelopt_layer_spec"]


def __getattr__(name: str) -> Any:
    if name != "use_modelopt_layer_spec":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ._modelopt_layer_spec_v03 import use_modelopt_layer_spec

    globals()[name] = use_modelopt_layer_spec
    return use_modelopt_layer_spec
