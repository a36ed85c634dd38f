"""slime's ``mtp_kwargs`` forward keyword, for a model given ``mtp.enable(model, mtp_kwargs=True)``.

slime's Megatron patch (``docker/patch/latest/megatron.patch``, ``gpt_model.py``) adds
``mtp_kwargs: Optional[dict]`` to ``GPTModel.forward`` and hands it to ``_postprocess``, which
reads ``mtp_kwargs["mtp_labels"]``. Upstream's ``forward`` takes no such keyword and passes a fixed
set to ``_postprocess``, so the bound ``forward`` here takes it off the call and keeps the tokens in a
context variable for the duration of the forward; the MTP postprocess reads them with
:func:`current_mtp_labels`. Context-local, so threads and interleaved pipeline schedules each see
their own. Bound per model instance by ``mtp.enable``, never on the class: a model not enabled so
refuses the keyword as upstream does. Imports neither torch nor megatron.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Callable

from .._errors import MTPOptionError

#: Attribute of the ``forward`` function bound here, so that only it is ever removed.
BOUND_MARK = "_patchkit_mtp_kwargs_forward"
#: The keys slime's ``mtp_kwargs`` may hold.
MTP_KWARGS_KEYS = frozenset({"mtp_labels"})

_mtp_labels: contextvars.ContextVar[Any] = contextvars.ContextVar("patchkit_mtp_labels", default=None)


def current_mtp_labels() -> Any:
    """The ``mtp_labels`` of the forward running now (None outside one, or when it was given none)."""
    return _mtp_labels.get()


def wrap_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``GPTModel.forward`` taking slime's ``mtp_kwargs={"mtp_labels": tokens}`` as well."""

    @functools.wraps(original)
    def forward(self: Any, *args: Any, mtp_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        given = dict(mtp_kwargs or {})
        unknown = sorted(set(given) - MTP_KWARGS_KEYS)
        if unknown:
            raise MTPOptionError(
                f"forward(mtp_kwargs=...) takes only {', '.join(sorted(MTP_KWARGS_KEYS))}; got {', '.join(unknown)}"
            )
        token = _mtp_labels.set(given.get("mtp_labels"))
        try:
            return original(self, *args, **kwargs)
        finally:
            _mtp_labels.reset(token)

    setattr(forward, BOUND_MARK, True)
    return forward


def is_bound_here(instance: Any) -> bool:
    """Whether ``instance`` carries a ``forward`` this module bound (and may remove)."""
    bound = vars(instance).get("forward")
    return getattr(getattr(bound, "__func__", None), BOUND_MARK, False) is True
