"""Masking a loaded vLLM model's logits (``patchkit.patches.vllm.logits`` exports these; its docstring
tells the story).

vLLM's models return fresh logits from ``compute_logits`` (``LogitsProcessor`` computes them from the
LM head for each call, and the model keeps no reference), so the mask writes ``-inf`` into them in place:
no copy per step. The one exception is a ``LogitsProcessor`` built with ``logits_as_input``, which
returns the caller's hidden states themselves; logits that share storage with an argument are copied
first, so the mask never writes into the model runner's buffers.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from vllm.model_executor.layers.logits_processor import LogitsProcessor

from .._errors import LogitsMaskError

logger = logging.getLogger(__name__)

_METHOD = "compute_logits"


@dataclass(frozen=True)
class LogitsMask:
    """What a masked model's logits lose: every id from ``vocab_size`` up, and ``banned_token_ids``
    (sorted, each once)."""

    vocab_size: int
    banned_token_ids: tuple[int, ...] = ()

    def check_width(self, width: int) -> None:
        """Raise :class:`LogitsMaskError` unless logits ``width`` ids wide can take this mask."""
        if self.vocab_size > width:
            raise LogitsMaskError(f"vocab_size {self.vocab_size} is larger than the model's logits width {width}")
        if self.banned_token_ids and self.banned_token_ids[-1] >= width:
            raise LogitsMaskError(
                f"banned token id {self.banned_token_ids[-1]} is outside the model's logits width {width}")


class _MaskedComputeLogits:
    """A model's ``compute_logits``, set on the instance, with ``mask`` applied to what it returns.

    Whatever the model's method takes (vLLM 0.24-0.33: ``hidden_states``; MTP drafters also
    ``spec_step_idx``) is passed through unchanged.
    """

    def __init__(self, original: Callable[..., Any], mask: LogitsMask, replaced_own: bool,
                 checked_width: int | None) -> None:
        self.original = original
        self.mask = mask
        #: The instance had its own ``compute_logits`` (set by someone else): undo puts it back.
        self.replaced_own = replaced_own
        #: The last logits width the mask was checked against: every step returns the same width, so
        #: the check runs again only when it changes (or when it could not be told ahead).
        self._checked_width = checked_width
        self._banned: dict[torch.device, torch.Tensor] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        logits = self.original(*args, **kwargs)
        if logits is None:  # a rank that holds no logits (a gather to another rank)
            return None
        if _shares_storage(logits, (*args, *kwargs.values())):
            logits = logits.clone()
        width = logits.shape[-1]
        if width != self._checked_width:
            self.mask.check_width(width)
            self._checked_width = width
        if self.mask.vocab_size < width:
            logits[..., self.mask.vocab_size:] = float("-inf")
        if self.mask.banned_token_ids:
            logits.index_fill_(-1, self._banned_ids(logits.device), float("-inf"))
        return logits

    def _banned_ids(self, device: torch.device) -> torch.Tensor:
        ids = self._banned.get(device)
        if ids is None:
            ids = torch.tensor(self.mask.banned_token_ids, dtype=torch.long, device=device)
            self._banned[device] = ids
        return ids


def mask_logits(model: Any, vocab_size: int, banned_token_ids: Iterable[int] | None = ()) -> LogitsMask:
    """Make ``model.compute_logits`` return ``-inf`` at ids ``>= vocab_size`` and at ``banned_token_ids``.

    ``model`` is a loaded vLLM model (``worker.model_runner.model``, a drafter model); its logits are
    otherwise exactly what its own ``compute_logits`` returns, same shape, dtype and device. Returns the
    mask. ``vocab_size`` is the tokenizer's vocabulary size (``len(tokenizer)``), a positive int no larger
    than the model's logits width; ``banned_token_ids`` are ints in ``[0, width)``.

    Masking a model again with the same mask does nothing and returns it; a different mask is refused
    (:class:`LogitsMaskError`): call :func:`unmask_logits` first. Masks never stack, so two callers
    cannot silently drop each other's ids. Bad input raises :class:`LogitsMaskError` and leaves the
    model as it was.

    Not covered: vLLM's opt-in batch-sharded sampling (``compute_logits_local``), which samples from
    per-rank vocabulary shards.
    """
    mask = _build_mask(vocab_size, banned_token_ids)
    compute_logits = getattr(model, _METHOD, None)
    if not callable(compute_logits):
        raise LogitsMaskError(f"{type(model).__name__} has no compute_logits: pass the loaded vLLM model")
    current = logits_mask(model)
    if current is not None:
        if current == mask:
            return current
        raise LogitsMaskError(
            f"{type(model).__name__} is already masked with {current}; call unmask_logits(model) before {mask}")
    width = _logits_width(model)
    if width is not None:
        mask.check_width(width)
    replaced_own = _METHOD in vars(model)
    setattr(model, _METHOD, _MaskedComputeLogits(compute_logits, mask, replaced_own, width))
    logger.info("masking %s's logits from id %d up and %d banned ids below",
                type(model).__name__, mask.vocab_size, len(mask.banned_token_ids))
    return mask


def unmask_logits(model: Any) -> LogitsMask | None:
    """Give ``model`` back the ``compute_logits`` it had before :func:`mask_logits`; returns the mask
    removed, or ``None`` when the model was not masked (then nothing changes)."""
    masked = vars(model).get(_METHOD)
    if not isinstance(masked, _MaskedComputeLogits):
        return None
    if masked.replaced_own:
        setattr(model, _METHOD, masked.original)
    else:
        delattr(model, _METHOD)
    return masked.mask


def logits_mask(model: Any) -> LogitsMask | None:
    """The mask ``model``'s logits carry, or ``None``."""
    masked = vars(model).get(_METHOD)
    return masked.mask if isinstance(masked, _MaskedComputeLogits) else None


def _build_mask(vocab_size: int, banned_token_ids: Iterable[int] | None) -> LogitsMask:
    size = _token_id(vocab_size, "vocab_size")
    if size <= 0:
        raise LogitsMaskError(f"vocab_size must be positive, got {size}")
    if banned_token_ids is None:
        banned_token_ids = ()
    if isinstance(banned_token_ids, (str, bytes)) or not isinstance(banned_token_ids, Iterable):
        raise LogitsMaskError(f"banned_token_ids must be ints, got {banned_token_ids!r}")
    banned = {_token_id(token, "banned token id") for token in banned_token_ids}
    negative = sorted(token for token in banned if token < 0)
    if negative:
        raise LogitsMaskError(f"banned token ids must not be negative, got {negative}")
    return LogitsMask(size, tuple(sorted(banned)))


def _token_id(value: Any, what: str) -> int:
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.is_floating_point()):
        raise LogitsMaskError(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)  # int, numpy and 0-dim integer tensors
    except TypeError:
        raise LogitsMaskError(f"{what} must be an int, got {value!r}") from None


def _logits_width(model: Any) -> int | None:
    """The width of ``model``'s logits, read from its ``LogitsProcessor`` (``org_vocab_size``: vLLM
    cuts the LM head's padding rows off before returning); ``None`` when that cannot be told ahead."""
    if not isinstance(model, torch.nn.Module):
        return None
    widths = {module.org_vocab_size for module in model.modules() if isinstance(module, LogitsProcessor)}
    return widths.pop() if len(widths) == 1 else None


def _shares_storage(logits: torch.Tensor, arguments: tuple[Any, ...]) -> bool:
    storage = logits.untyped_storage().data_ptr()
    return any(isinstance(argument, torch.Tensor) and argument.untyped_storage().data_ptr() == storage
               for argument in arguments)
