"""Multi-token prediction (MTP) for RL: the patches, and per-model control of what they change.

The declared patches (``megatron.mtp_postprocess``, ``megatron.mtp_detach_inputs``,
``megatron.mtp_recompute``, ``megatron.mtp_router_slots``, declared beside this file) change the
``GPTModel`` / ``MultiTokenPredictionLayer`` classes, so every model of the process. A trainer that
also holds a frozen reference model may want the behaviour on the policy only::

    from patchkit.patches.megatron import mtp

    mtp.enable(policy_chunks)                      # logits out, MTP trains, output head detached
    mtp.enable(policy_chunks, detach_inputs=True)  # ... and no MTP gradient into the backbone
    mtp.disable(reference_model)                   # upstream's behaviour even if patched globally
    mtp.enable(policy_chunks, with_labels="derive")  # MTP labels from input_ids ("skip": no MTP)
    mtp.enable(policy_chunks, without_labels="derive-mask-as-given", per_token_loss="unscaled")  # ROLL's RL
    mtp.enable(policy_chunks, mtp_kwargs=True)     # slime: forward(..., mtp_kwargs={"mtp_labels": tokens})
    mtp.enable(policy_chunks, returns="loss")      # a forward with labels returns the LM loss
    with mtp.loss_scale(factor): model(...)        # this micro-batch's MTP loss times factor

Both take a ``GPTModel``, anything wrapping one through ``.module`` (DDP, ``Float16Module``) or
``.language_model`` (a vision-language model), or a list of model chunks, and return the
``GPTModel`` instances they changed. Process-wide, the default
output-head choice is ``PATCHKIT_MTP_OUTPUT_HEAD`` or :func:`configure`.

The public names are imported from their private modules on first use (PEP 562), so importing this
package, as the catalogue does for its declarations, imports neither torch nor megatron.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports
from .._errors import MTPModelError, MTPOptionError

if TYPE_CHECKING:
    from ._api import disable, enable
    from ._loss_scale import current_loss_scale, loss_scale
    from ._options import MTPOptions, configure, options_for

#: Imported on first use; the errors above are bound now, so a caller catches them without megatron.
_EXPORTS = {
    "MTPOptions": "._options",
    "configure": "._options",
    "options_for": "._options",
    "disable": "._api",
    "enable": "._api",
    "current_loss_scale": "._loss_scale",
    "loss_scale": "._loss_scale",
}
__all__ = [
    "MTPModelError", "MTPOptionError", "MTPOptions", "configure", "current_loss_scale", "disable", "enable",
    "loss_scale", "options_for",
]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
