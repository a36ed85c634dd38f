"""Megatron-Bridge support for ModelOpt QAT models: the patches, and the public helper.

Each behaviour is its own patch, declared in its own module, so it can be switched off alone
(``bridge.modelopt_layer_spec``, ``bridge.quant_linear_parallelism``, ``bridge.skip_quantizer_params``,
``bridge.expert_local_to_global``, ``bridge.expert_sort_key``);
the ranges are the Bridge releases whose sources were read and whose tests ran (0.2.0rc6, 0.3.1,
0.4.2, 0.5.1, 0.6.2; 0.4.0, 0.5.0 and 0.6.0 read from their wheels). Each ``native`` variant names
what upstream does instead, and ``tests/bridge`` shows upstream doing it; why each is needed:
the implementation modules' docstrings.

The patches are declared beside this file; the package is the family's public API, and its one
helper is imported on first use (PEP 562), so importing the package stays cheap:
:func:`use_modelopt_layer_spec` (the fresh-QAT switch, the same call on every Bridge release).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports

if TYPE_CHECKING:
    from ._modelopt_layer_spec import use_modelopt_layer_spec

_EXPORTS = {"use_modelopt_layer_spec": "._modelopt_layer_spec"}
__all__ = [
    "use_modelopt_layer_spec",
]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
