"""What the MTP patches do for one model: the options, their process default, and per-model marks.

Frameworks disagree on one point, so it is an option with a default rather than a silent choice:

- ``output_head``: whether the MTP loss trains the output layer (lm_head) the main head shares.
  ``"detached"`` (default; verl #6432 and slime detach it for RL, so the auxiliary MTP loss never
  moves the policy's head) computes each depth's logits with every output-layer parameter (weight,
  bias if any, a shared embedding weight) cut from the graph; the logits' values are unchanged.
  ``"trained"`` is upstream Megatron's behaviour (and NeMo-RL's): the MTP loss back-propagates into
  the output layer too.

The process default comes from ``PATCHKIT_MTP_OUTPUT_HEAD`` (read once, on first use, so every
process of a job agrees without code) or :func:`configure`; a model marked by
``mtp_api.enable``/``disable`` carries its own options and ignores the default.

This module imports neither torch nor megatron.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

OUTPUT_HEAD_ENV = "PATCHKIT_MTP_OUTPUT_HEAD"
OUTPUT_HEAD_CHOICES = ("detached", "trained")
#: Attribute a model instance (GPTModel) carries once marked per model.
MODEL_MARK = "_patchkit_mtp_options"
#: Attribute an MTP layer instance carries once marked per model (its input detach choice).
LAYER_MARK = "_patchkit_mtp_detach_inputs"


class MTPOptionError(ValueError):
    """An MTP option was given a value it does not take."""


class MTPOptions(NamedTuple):
    """How the MTP postprocess patch treats one model.

    ``enabled`` False means upstream's behaviour for this model even where the process-wide patch
    is applied (a frozen reference model). ``output_head`` as in the module docstring.
    """

    enabled: bool = True
    output_head: str = "detached"

    @property
    def detach_output_head(self) -> bool:
        return self.output_head == "detached"


def check_output_head(value: str, source: str) -> str:
    if value not in OUTPUT_HEAD_CHOICES:
        raise MTPOptionError(
            f"{source}: output_head must be one of {', '.join(OUTPUT_HEAD_CHOICES)}; got {value!r}. "
            "'detached' keeps the MTP loss off the shared output layer (default), 'trained' is upstream's."
        )
    return value


_default: MTPOptions | None = None


def default_options() -> MTPOptions:
    """The process default, from ``PATCHKIT_MTP_OUTPUT_HEAD`` on first use unless configured."""
    global _default
    if _default is None:
        raw = os.environ.get(OUTPUT_HEAD_ENV, "").strip().lower() or "detached"
        _default = MTPOptions(output_head=check_output_head(raw, OUTPUT_HEAD_ENV))
    return _default


def configure(*, output_head: str | None = None) -> MTPOptions:
    """Set the process default (what a model not marked per model gets); returns the new default."""
    global _default
    current = default_options()
    if output_head is not None:
        current = current._replace(output_head=check_output_head(output_head, "configure(output_head=...)"))
    _default = current
    return current


def reset_default() -> None:
    """Forget the configured default; the next use reads the environment again (for tests)."""
    global _default
    _default = None


def options_for(model: Any) -> MTPOptions:
    """The options that apply to ``model``: its own mark, else the process default."""
    marked = getattr(model, MODEL_MARK, None)
    return marked if isinstance(marked, MTPOptions) else default_options()


def detach_inputs_for(layer: Any, default: bool) -> bool:
    """Whether an MTP layer's inputs are detached: its own mark, else ``default``."""
    marked = getattr(layer, LAYER_MARK, None)
    return marked if isinstance(marked, bool) else default
