"""The MTP functions of the public API (``patchkit.patches.megatron.mtp``): MTP for one model at a time.

``enable`` binds the patched methods to the given model instances only (the class is untouched),
using the variant of the installed megatron-core that the declaration selects, and marks them with
their options; ``disable`` marks a model so that the process-wide patch, if applied, leaves it to
upstream. This module imports neither torch nor megatron until a function is called.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

from .._errors import MTPModelError
from ._mtp_kwargs import is_bound_here, wrap_forward
from ._options import (
    LAYER_MARK,
    MODEL_MARK,
    MTPOptions,
    check_output_head,
    check_per_token_loss,
    check_returns,
    check_with_labels,
    check_without_labels,
    default_options,
)

_DECLARATION_PACKAGE = __package__
_POSTPROCESS_PATCH = "megatron.mtp_postprocess"
_DETACH_PATCH = "megatron.mtp_detach_inputs"


def _unwrap_gpt(chunk: Any, gpt_class: type) -> Any:
    """The ``GPTModel`` inside ``chunk``: through ``.module`` (DDP, ``Float16Module``) and, for a
    vision-language model, its ``.language_model`` (as verl's MTP patch finds the model it patches)."""
    inner = chunk
    while not isinstance(inner, gpt_class):
        if hasattr(inner, "module"):
            inner = inner.module
        elif hasattr(inner, "language_model") and inner.language_model is not None:
            inner = inner.language_model
        else:
            break
    return inner


def _gpt_models(model: Any) -> list[Any]:
    from megatron.core.models.gpt.gpt_model import GPTModel

    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    found = []
    for chunk in chunks:
        inner = _unwrap_gpt(chunk, GPTModel)
        if not isinstance(inner, GPTModel):
            raise MTPModelError(
                f"expected a megatron GPTModel (or a wrapper with .module or .language_model, or a list "
                f"of chunks); found {type(chunk).__name__} holding {type(inner).__name__}"
            )
        found.append(inner)
    return found


def _mtp_layers(gpt: Any) -> Iterable[Any]:
    mtp = getattr(gpt, "mtp", None)
    return list(getattr(mtp, "layers", ())) if mtp is not None else []


def _factory(patch_id: str) -> Any:
    """The ``Wrap`` factory of the variant the declaration selects for the installed megatron-core."""
    from patchkit.runtime.errors import PatchkitError
    from patchkit.runtime.installer import resolve_reference
    from patchkit.runtime.versions import Outcome, installed_version, select_variant

    from . import mtp_detach_inputs, mtp_postprocess

    patch = next(p for module in (mtp_postprocess, mtp_detach_inputs) for p in module.PATCHES if p.id == patch_id)
    versions = {dist: installed_version(dist, patch.version_modules.get(dist)) for dist in patch.distributions}
    selection = select_variant(patch, versions)
    if selection.outcome is not Outcome.SELECTED or selection.variant is None:
        raise PatchkitError(f"{patch_id} cannot be enabled per model here: {selection.detail}")
    (action,) = selection.variant.installs
    return resolve_reference(action.factory, _DECLARATION_PACKAGE)


def _bind(instance: Any, method: str, factory: Any) -> None:
    unbound = getattr(type(instance), method)
    setattr(instance, method, types.MethodType(factory(unbound), instance))


def enable(
    model: Any,
    *,
    output_head: str | None = None,
    without_labels: str | None = None,
    with_labels: str | None = None,
    detach_inputs: bool = False,
    per_token_loss: str | None = None,
    returns: str | None = None,
    mtp_kwargs: bool = False,
) -> list[Any]:
    """Give ``model`` (and only it) the MTP postprocess behaviour, with its own options.

    ``model``: a ``GPTModel``, a wrapper holding one as ``.module`` (DDP, ``Float16Module``) or as
    ``.language_model`` (a vision-language model), or a list of such chunks.

    ``output_head``: ``"detached"`` or ``"trained"``; ``without_labels``: ``"skip"``, ``"derive"``
    or ``"derive-mask-as-given"``; ``with_labels``: ``"attach"``, ``"derive"`` or ``"skip"``;
    ``per_token_loss``: ``"rescaled"`` or ``"unscaled"``; ``returns``: ``"logits"`` or ``"loss"``
    (see ``mtp._options``); each defaults to the process default. ``detach_inputs``:
    also detach the MTP layers' inputs (``megatron.mtp_detach_inputs`` for this model only).
    ``mtp_kwargs``: the model's ``forward`` takes slime's ``mtp_kwargs={"mtp_labels": tokens}``,
    and MTP runs only on a forward given them (``mtp._mtp_kwargs``; ``forward`` is bound on the
    instance). Calling it again replaces the options; the methods are bound once. Every option is
    checked before any model changes.
    """
    defaults = default_options()
    head = check_output_head(output_head, "enable(output_head=...)") if output_head else defaults.output_head
    no_labels = (
        check_without_labels(without_labels, "enable(without_labels=...)")
        if without_labels
        else defaults.without_labels
    )
    with_given = (
        check_with_labels(with_labels, "enable(with_labels=...)") if with_labels else defaults.with_labels
    )
    weighting = (
        check_per_token_loss(per_token_loss, "enable(per_token_loss=...)")
        if per_token_loss
        else defaults.per_token_loss
    )
    returned = check_returns(returns, "enable(returns=...)") if returns else defaults.returns
    models = _gpt_models(model)
    postprocess = _factory(_POSTPROCESS_PATCH)
    detach = _factory(_DETACH_PATCH) if detach_inputs else None
    if mtp_kwargs:
        foreign = [gpt for gpt in models if "forward" in vars(gpt) and not is_bound_here(gpt)]
        if foreign:
            raise MTPModelError(
                f"enable(mtp_kwargs=True) binds forward on the model, but {len(foreign)} of the given models "
                "already carry a forward of their own on the instance; bind yours after enabling"
            )
    for gpt in models:
        if not isinstance(getattr(gpt, MODEL_MARK, None), MTPOptions) or "_postprocess" not in vars(gpt):
            _bind(gpt, "_postprocess", postprocess)
        setattr(gpt, MODEL_MARK, MTPOptions(
            enabled=True, output_head=head, without_labels=no_labels, with_labels=with_given,
            per_token_loss=weighting, returns=returned, mtp_kwargs=mtp_kwargs,
        ))
        if mtp_kwargs and not is_bound_here(gpt):
            _bind(gpt, "forward", wrap_forward)
        elif not mtp_kwargs and is_bound_here(gpt):
            del vars(gpt)["forward"]
        for layer in _mtp_layers(gpt):
            if detach is not None and "_get_embeddings" not in vars(layer):
                _bind(layer, "_get_embeddings", detach)
            setattr(layer, LAYER_MARK, detach_inputs)
    return models


def disable(model: Any) -> list[Any]:
    """Leave ``model`` to upstream: per-model bindings removed, the process-wide patches skip it."""
    models = _gpt_models(model)
    for gpt in models:
        vars(gpt).pop("_postprocess", None)
        if is_bound_here(gpt):
            del vars(gpt)["forward"]
        setattr(gpt, MODEL_MARK, MTPOptions(enabled=False))
        for layer in _mtp_layers(gpt):
            vars(layer).pop("_get_embeddings", None)
            setattr(layer, LAYER_MARK, False)
    return models
