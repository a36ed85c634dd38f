"""``Eagle3LlamaForCausalLM.__init__`` (``vllm/model_executor/models/llama_eagle3.py``) declaring its own
``lm_head`` when its vocabulary is truncated.

vLLM builds an EAGLE-3 draft's ``lm_head`` with ``draft_vocab_size`` rows and maps its logits to target ids
through ``draft_id_to_target_id`` (``d2t``). Whether the proposer keeps that head is decided by the
draft's ``has_own_lm_head``, which upstream leaves at the interface default ``False`` and sets to ``True``
only when ``load_weights`` meets an ``lm_head`` weight. A draft built without reading one (dummy load
format and weights pushed in later, as RL trainers refit a draft they train) is then given the target's
full-vocabulary head: the V1 proposer's ``_maybe_share_lm_head`` and the V2 model runner's
``load_eagle_model`` (``_should_share``) delete the draft's head and put the target's in its place, and
the draft's logits no longer match its ``d2t`` map.

Here the draft says so as it is built: ``has_own_lm_head`` is ``draft_vocab_size != vocab_size``. A
draft with the full vocabulary keeps upstream's default (share the target's head); a later
``load_weights`` that meets an ``lm_head`` weight still sets ``True`` as before.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)


def owns_truncated_lm_head(config: Any) -> bool:
    """True when a draft config's ``draft_vocab_size`` differs from its ``vocab_size`` (a truncated head)."""
    return getattr(config, "draft_vocab_size", None) != getattr(config, "vocab_size", None)


def wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    """``Eagle3LlamaForCausalLM.__init__`` that sets ``has_own_lm_head`` from the draft's vocabulary."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.has_own_lm_head = owns_truncated_lm_head(self.config)
        if self.has_own_lm_head:
            logger.debug("patchkit: EAGLE-3 draft with a %s-token vocabulary (target %s) keeps its own lm_head",
                         self.config.draft_vocab_size, self.config.vocab_size)

    return __init__
