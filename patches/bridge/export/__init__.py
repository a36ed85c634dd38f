"""Megatron-Bridge export helpers: the names, shapes and dtypes of a Hugging Face export, without the export.

:func:`export_shapes` runs Bridge's own ``AutoBridge.export_hf_weights`` on the model's parameters as
``meta`` tensors, with Bridge's tensor collectives made shape-only for the calling thread while a Bridge
step runs, and yields ``(name, shape, dtype)`` for every Hugging Face tensor, in Bridge's order: the
shapes are the full (unsharded) ones every rank would receive, no weight is gathered and no weight memory
is allocated. The same call on every Bridge release patchkit claims (0.2-0.6). It is a helper, not a
patch: nothing is installed into Bridge or torch outside the call (docs/bridge-export-shapes.md).

The helper is imported on first use (PEP 562), so importing the package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports

if TYPE_CHECKING:
    from ._shapes import ExportedShape, export_shapes

_EXPORTS = {"ExportedShape": "._shapes", "export_shapes": "._shapes"}
__all__ = [
    "ExportedShape",
    "export_shapes",
]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
