"""Public API: keep vLLM's sampler off token ids the tokenizer never produces, or must never emit.

vLLM computes logits over the model's embedding rows. Many checkpoints pad that table past the
tokenizer's vocabulary (Qwen2.5's 151,936 rows for 151,665 tokens), and the padded rows still score:
a sampler can pick an id no tokenizer can decode (vLLM issue 13175). Some ids inside the vocabulary
are illegal to generate as well, such as a vision-language model's image and video placeholders. With a mask,
the logits at those ids are ``-inf`` in every ``compute_logits`` output, so no sampling mode picks them::

    from patchkit.patches.vllm.logits import mask_logits, unmask_logits

    # in the worker process, on the loaded model (worker.model_runner.model)
    mask_logits(model, vocab_size=len(tokenizer), banned_token_ids=placeholder_ids)
    ...
    unmask_logits(model)  # the model's own compute_logits again

The mask is set on the model instance; nothing of vLLM's classes changes, and no patch needs to be
installed. The names below are imported from their private module on first use (PEP 562), so importing
this package imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports
from .._errors import LogitsMaskError

if TYPE_CHECKING:
    from ._mask import LogitsMask, logits_mask, mask_logits, unmask_logits

#: Imported on first use; the error above is bound now, so a caller catches it without importing torch.
_EXPORTS = dict.fromkeys(("LogitsMask", "logits_mask", "mask_logits", "unmask_logits"), "._mask")
__all__ = ["LogitsMask", "LogitsMaskError", "logits_mask", "mask_logits", "unmask_logits"]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
