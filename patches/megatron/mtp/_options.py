"""What the MTP patches do for one model: the options, their process default, and per-model marks.

Frameworks disagree on two points, so each is an option with a default rather than a silent choice:

- ``output_head``: whether the MTP loss trains the output layer (lm_head) the main head shares.
  ``"detached"`` (default; verl #6432 and slime detach it for RL, so the auxiliary MTP loss never
  moves the policy's head) computes each depth's logits with every output-layer parameter (weight,
  bias if any, a shared embedding weight) cut from the graph; the logits' values are unchanged.
  ``"trained"`` is upstream Megatron's behaviour (and NeMo-RL's): the MTP loss back-propagates into
  the output layer too.
- ``without_labels``: what a forward without ``labels`` does with the MTP block. ``"skip"``
  (default; verl's ``_postprocess`` patch runs the MTP block only when labels are given, ROLL's
  ``disabled`` mode never, and megatron-core 0.14-0.18 compute no MTP loss without them) returns
  the main-head logits and runs no MTP layer: a reference model's or a rollout's log-prob pass neither pays for MTP nor
  attaches an MTP loss that would move the gradients if the pass were differentiated. ``"derive"`` is megatron-core
  0.19's behaviour (and so NeMo-RL's, which runs 0.19 unpatched): the MTP labels are the input ids
  rolled left by one, the loss mask rolled alike, and every depth's MTP loss is attached as with
  labels; the patch does the same on 0.14-0.18. ``"derive-mask-as-given"`` is ROLL's RL forward
  (``roll/third_party/megatron/mtp_patcher.py:patched_gpt_postprocess`` given ``labels=None``): the
  MTP labels are the input ids rolled left once, but the caller's loss mask is used as given (it is
  already aligned with those labels), not rolled once more.

- ``with_labels``: what a forward *with* ``labels`` does with the MTP block. ``"attach"`` (default,
  upstream's and verl's) attaches every depth's loss against the caller's labels. ``"derive"``
  (ROLL's) takes the MTP labels from ``input_ids`` rolled left once, whatever labels the caller
  gave, with the caller's loss mask as given (it is aligned with the labels, which are the input
  ids shifted); the main-head logits are unchanged. ``"skip"`` (ROLL's ``disabled`` training
  mode: MTP weights loaded, not trained) runs no MTP layer and attaches nothing, labels or not.

- ``per_token_loss``: how each depth's per-token loss is weighed under ``calculate_per_token_loss``.
  ``"rescaled"`` (default; megatron-core 0.17+'s ``process_mtp_loss``, done the same way on
  0.14-0.16) multiplies it by the loss mask's token count over the depth's rolled count, so each MTP
  token weighs what a main-loss token weighs once ``finalize_model_grads`` divides by the main
  loss's count. ``"unscaled"`` attaches it as megatron-core 0.14-0.16 do, and as ROLL's and slime's
  ``_postprocess`` do on every release: ``mtp_loss_scaling_factor / mtp_num_layers`` times the
  masked per-token loss. Without ``calculate_per_token_loss`` both divide by the rolled count.
- ``returns``: what a forward *with* labels returns. ``"logits"`` (default; what an RL trainer
  computes its own loss from) or ``"loss"``: upstream's per-token LM loss ``[b, s]`` of the main
  head against the caller's labels (ROLL's SFT path), with the MTP losses attached as for logits.
  A forward without labels returns the logits either way.
- ``mtp_kwargs`` (per model only, ``mtp.enable(model, mtp_kwargs=True)``): slime's contract. The
  model's ``forward`` takes ``mtp_kwargs={"mtp_labels": tokens}`` (slime's Megatron patch,
  ``docker/patch/latest/megatron.patch``, ``gpt_model.py``); MTP runs, and its losses are attached,
  only on a forward given ``mtp_labels``: the MTP labels are those tokens rolled left once and the
  loss mask is rolled alike (all ones, not rolled, when None), whatever ``labels`` says. A forward
  without them runs no MTP layer; ``with_labels`` and ``without_labels`` do not apply.

The per-forward scale of the MTP loss is :func:`loss_scale` (``mtp_loss_scaling_factor`` times a
factor the caller computes per micro-batch, as verl's ``_verl_mtp_loss_normalization_factor``).

The process defaults come from ``PATCHKIT_MTP_OUTPUT_HEAD`` and ``PATCHKIT_MTP_WITHOUT_LABELS``
(parsed by ``patchkit.runtime.settings`` like every ``PATCHKIT_*`` variable, once, on first use,
so every process of a job agrees without code) or :func:`configure`; a model marked by
``mtp.enable``/``disable`` carries its own options and ignores the default.

This module imports neither torch nor megatron.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from patchkit.runtime import settings
from patchkit.runtime.errors import ConfigError

from .._errors import MTPOptionError

OUTPUT_HEAD_ENV = settings.MTP_OUTPUT_HEAD
OUTPUT_HEAD_CHOICES = settings.CHOICES[OUTPUT_HEAD_ENV]
WITHOUT_LABELS_ENV = settings.MTP_WITHOUT_LABELS
WITHOUT_LABELS_CHOICES = settings.CHOICES[WITHOUT_LABELS_ENV]
WITH_LABELS_CHOICES = ("attach", "derive", "skip")
PER_TOKEN_LOSS_CHOICES = ("rescaled", "unscaled")
RETURNS_CHOICES = ("logits", "loss")
#: Attribute a model instance (GPTModel) carries once marked per model.
MODEL_MARK = "_patchkit_mtp_options"
#: Attribute an MTP layer instance carries once marked per model (its input detach choice).
LAYER_MARK = "_patchkit_mtp_detach_inputs"


class MTPOptions(NamedTuple):
    """How the MTP postprocess patch treats one model.

    ``enabled`` False means upstream's behaviour for this model even where the process-wide patch
    is applied (a frozen reference model). ``output_head``, ``without_labels``, ``with_labels``,
    ``per_token_loss``, ``returns`` and ``mtp_kwargs`` as in the module docstring.
    """

    enabled: bool = True
    output_head: str = "detached"
    without_labels: str = "skip"
    with_labels: str = "attach"
    per_token_loss: str = "rescaled"
    returns: str = "logits"
    mtp_kwargs: bool = False

    @property
    def detach_output_head(self) -> bool:
        return self.output_head == "detached"

    @property
    def rescale_per_token_loss(self) -> bool:
        return self.per_token_loss == "rescaled"

    def runs_mtp(self, has_labels: bool, has_mtp_labels: bool = False) -> bool:
        """Whether a forward with (or without) labels, and with (or without) slime's ``mtp_labels``,
        runs the MTP block and attaches its losses."""
        if self.mtp_kwargs:
            return has_mtp_labels
        if has_labels:
            return self.with_labels != "skip"
        return self.without_labels != "skip"


def _check_choice(option: str, choices: tuple[str, ...], meaning: str, value: str, source: str) -> str:
    if value not in choices:
        raise MTPOptionError(f"{source}: {option} must be one of {', '.join(choices)}; got {value!r}. {meaning}")
    return value


def check_output_head(value: str, source: str) -> str:
    return _check_choice("output_head", OUTPUT_HEAD_CHOICES, "'detached' keeps the MTP loss off the shared output "
                         "layer (default), 'trained' is upstream's.", value, source)


def check_without_labels(value: str, source: str) -> str:
    return _check_choice("without_labels", WITHOUT_LABELS_CHOICES, "'skip' runs no MTP without labels (default), "
                         "'derive' is megatron-core 0.19's (labels from input_ids, mask rolled alike), "
                         "'derive-mask-as-given' ROLL's (labels from input_ids, mask as given).", value, source)


def check_per_token_loss(value: str, source: str) -> str:
    return _check_choice("per_token_loss", PER_TOKEN_LOSS_CHOICES, "'rescaled' weighs MTP tokens as megatron-core "
                         "0.17+ do (default), 'unscaled' as 0.14-0.16, ROLL and slime do.", value, source)


def check_returns(value: str, source: str) -> str:
    return _check_choice("returns", RETURNS_CHOICES, "'logits' returns the main-head logits (default), 'loss' "
                         "upstream's LM loss against the caller's labels.", value, source)


def check_with_labels(value: str, source: str) -> str:
    return _check_choice("with_labels", WITH_LABELS_CHOICES, "'attach' attaches the MTP losses against the "
                         "caller's labels (default), 'derive' takes the MTP labels from input_ids, 'skip' runs "
                         "no MTP.", value, source)


_default: MTPOptions | None = None


def default_options() -> MTPOptions:
    """The process default, from the environment on first use unless configured.

    Both variables are checked before either is used, so a bad value sets no default.
    """
    global _default
    if _default is None:
        _default = MTPOptions(
            output_head=_from_environment(OUTPUT_HEAD_ENV, check_output_head),
            without_labels=_from_environment(WITHOUT_LABELS_ENV, check_without_labels),
        )
    return _default


def _from_environment(variable: str, check: Callable[[str, str], str]) -> str:
    """The variable as patchkit's settings parse it; a bad value raises this module's error, which
    says what each choice does."""
    try:
        return settings.choice(variable)
    except ConfigError as exc:
        bad = exc.value
    return check(bad.strip().lower(), variable)  # raises MTPOptionError: settings and check share the choices


def configure(
    *,
    output_head: str | None = None,
    without_labels: str | None = None,
    with_labels: str | None = None,
    per_token_loss: str | None = None,
    returns: str | None = None,
) -> MTPOptions:
    """Set the process default (what a model not marked per model gets); returns the new default.

    Every value is checked before the default changes: a bad one leaves it as it was. ``mtp_kwargs``
    is per model only (it binds the model's ``forward``): ``mtp.enable(model, mtp_kwargs=True)``.
    """
    global _default
    current = default_options()
    if output_head is not None:
        current = current._replace(output_head=check_output_head(output_head, "configure(output_head=...)"))
    if without_labels is not None:
        current = current._replace(
            without_labels=check_without_labels(without_labels, "configure(without_labels=...)")
        )
    if with_labels is not None:
        current = current._replace(with_labels=check_with_labels(with_labels, "configure(with_labels=...)"))
    if per_token_loss is not None:
        current = current._replace(
            per_token_loss=check_per_token_loss(per_token_loss, "configure(per_token_loss=...)")
        )
    if returns is not None:
        current = current._replace(returns=check_returns(returns, "configure(returns=...)"))
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
