"""Pieces every MTP postprocess variant shares: the output head the MTP loss sees, and its CP group.

- :func:`mtp_output_layer`: the output layer as the MTP loss calls it. With the output head
  detached, every parameter of the layer (weight, a bias if one exists) and a shared embedding
  weight passed in as ``weight=`` are cut from the graph through ``torch.func.functional_call``,
  so the logits' values are exactly the head's while no MTP gradient reaches it. Detaching only
  ``weight`` (verl #6432's first form) would leave an output-layer bias trained; upstream's
  ``GPTModel`` builds its output layer with ``bias=False``, but a model that swaps in its own head
  may have one. ``ColumnParallelLinear`` sees a weight that does not require grad and takes its
  frozen-weight path, so no weight-gradient buffer is touched.
- :func:`mtp_targets`: the labels and loss mask a forward's MTP loss is computed against, as the
  model's options say (``mtp._options``), or None where the forward runs no MTP.
- :func:`undo_per_token_rescale`: ``per_token_loss="unscaled"`` on releases whose
  ``process_mtp_loss`` rescales per-token losses (0.17+).
- :func:`mtp_cp_group`: dynamic context parallelism hands the batch's CP group in
  ``packed_seq_params.cp_group`` (megatron-core 0.16+); the MTP label/mask roll must use that
  group, not the model's static one, or it exchanges boundary tokens with the wrong ranks.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch import Tensor


class DetachedOutputLayer:
    """Calls ``layer`` with all its parameters detached; other attributes read through to ``layer``.

    Upstream code given this object in place of the output layer (``process_mtp_loss`` reads
    ``output_layer.weight`` and, in 0.19, passes it to its acceptance counter) sees the real layer's
    attributes; only the call differs.
    """

    def __init__(self, layer: torch.nn.Module) -> None:
        self._layer = layer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)

    def __call__(self, hidden_states: Tensor, *args: Any, weight: Optional[Tensor] = None, **kwargs: Any) -> Any:
        detached = {name: param.detach() for name, param in self._layer.named_parameters()}
        if weight is not None:
            weight = weight.detach()
        return torch.func.functional_call(
            self._layer, detached, (hidden_states, *args), {"weight": weight, **kwargs}, strict=False
        )


def mtp_output_layer(model: Any, detach: bool) -> Any:
    """``model.output_layer``, or a detached view of it when the MTP loss must not train the head."""
    return DetachedOutputLayer(model.output_layer) if detach else model.output_layer


def mtp_cp_group(packed_seq_params: Any, static_group: Any) -> Any:
    """The batch's CP group when dynamic CP sets one, else the model's own."""
    dynamic = getattr(packed_seq_params, "cp_group", None) if packed_seq_params is not None else None
    return dynamic if dynamic is not None else static_group


def safe_token_count(num_tokens: Tensor) -> Tensor:
    """``num_tokens`` clamped to at least 1: a rank or micro-batch with no loss token divides by 1.

    Its loss is all zeros then, so the result is 0 with a finite gradient instead of 0/0 = NaN
    (verl #6464: a CP rank holding only masked tokens). Upstream clamps the same way from 0.17.
    No host sync: the clamp stays on the device.
    """
    return num_tokens.clamp(min=1)


def caller_mask_with_input_id_labels(
    input_ids: Tensor, loss_mask: Optional[Tensor], roll: Callable[[Tensor], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Optional[Tensor]]:
    """``with_labels="derive"``: MTP labels are ``input_ids`` rolled left once; the caller's loss mask
    is kept as given (it belongs to the caller's labels, which are the input ids shifted)."""
    labels, _ = roll(input_ids)
    return labels, loss_mask


def scaled_config(config: Any, factor: float) -> Any:
    """``config``, or a shallow copy whose ``mtp_loss_scaling_factor`` is multiplied by ``factor``."""
    if factor == 1.0:
        return config
    scaled = copy.copy(config)
    scaled.mtp_loss_scaling_factor = config.mtp_loss_scaling_factor * factor
    return scaled


def labels_from_mtp_labels(
    mtp_labels: Tensor, loss_mask: Optional[Tensor], roll: Callable[[Tensor], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Optional[Tensor]]:
    """slime's ``mtp_kwargs={"mtp_labels": tokens}``: the tokens rolled left once, the loss mask rolled
    alike when given (slime's Megatron patch, ``gpt_model.py`` ``_postprocess``, rolls both before the
    depths; a None mask stays None and becomes all ones, unrolled, as there)."""
    labels, _ = roll(mtp_labels)
    if loss_mask is not None:
        loss_mask, _ = roll(loss_mask)
    return labels, loss_mask


def mtp_targets(
    options: Any,
    labels: Optional[Tensor],
    loss_mask: Optional[Tensor],
    input_ids: Tensor,
    mtp_labels: Optional[Tensor],
    roll: Callable[[Tensor], tuple[Tensor, Tensor]],
) -> Optional[tuple[Tensor, Optional[Tensor]]]:
    """The labels and loss mask of the MTP loss of one forward, or None where it runs no MTP.

    ``options`` is the model's ``MTPOptions``; ``labels`` and ``loss_mask`` are the caller's,
    ``mtp_labels`` slime's (read only under ``mtp_kwargs``); ``roll`` is the release's
    ``roll_tensor`` one token left with the batch's CP group and packed sequences bound.
    """
    if not options.runs_mtp(labels is not None, mtp_labels is not None):
        return None
    if options.mtp_kwargs:
        return labels_from_mtp_labels(mtp_labels, loss_mask, roll)
    if labels is not None:
        if options.with_labels == "derive":
            return caller_mask_with_input_id_labels(input_ids, loss_mask, roll)
        return labels, loss_mask
    if options.without_labels == "derive":
        return labels_from_input_ids(input_ids, loss_mask, roll)
    # "derive-mask-as-given" (ROLL's RL forward): labels from the ids, the mask is already theirs.
    return caller_mask_with_input_id_labels(input_ids, loss_mask, roll)


def undo_per_token_rescale(
    compute_language_model_loss: Callable[[Tensor, Tensor], Tensor],
    labels: Tensor,
    loss_mask: Optional[Tensor],
    roll: Callable[[Tensor], tuple[Tensor, Tensor]],
) -> Callable[[Tensor, Tensor], Tensor]:
    """``compute_language_model_loss`` for ``process_mtp_loss`` (0.17+) under ``per_token_loss="unscaled"``.

    Under ``calculate_per_token_loss``, ``process_mtp_loss`` attaches each depth's masked per-token loss
    times ``original_num_tokens / num_tokens`` (the mask's count over the depth's rolled count). The
    attached tensor only carries gradient (``MTPLossAutoScaler`` backpropagates ones times the main
    loss's scale, whatever its value), so the per-token loss returned here has the value upstream
    computes, which the tracker logs, and a gradient multiplied by ``num_tokens / original_num_tokens``:
    the attached loss then trains as 0.14-0.16's unscaled one. The depth's rolled count is recomputed
    here by rolling the mask in lockstep with upstream's loop (one more ``roll_tensor`` per depth).
    """
    mask = loss_mask if loss_mask is not None else torch.ones_like(labels)
    original_num_tokens = mask.sum()

    def compute(depth_labels: Tensor, logits: Tensor) -> Tensor:
        nonlocal mask
        mask, num_tokens = roll(mask)
        # original_num_tokens == 0 leaves an all-zero mask: upstream's factor is 0 and so is the loss.
        undo = safe_token_count(num_tokens) / safe_token_count(original_num_tokens)
        loss = compute_language_model_loss(depth_labels, logits)
        return loss.detach() + (loss - loss.detach()) * undo

    return compute


def labels_from_input_ids(
    input_ids: Tensor, loss_mask: Optional[Tensor], roll: Callable[[Tensor], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor]:
    """Labels and loss mask for the MTP loss of a forward given no labels, as megatron-core 0.19 makes them.

    From 0.19's ``process_mtp_loss``: the labels are ``input_ids`` rolled left once (``label[i] =
    input_id[i + 1]``; ``roll`` is the release's ``roll_tensor`` with its CP group / packed
    sequences bound), and the loss mask (all ones when None) is rolled in lockstep, so the last
    position of each sequence, whose rolled-in label is fabricated, carries no loss.
    """
    labels, _ = roll(input_ids)
    if loss_mask is None:
        loss_mask = torch.ones_like(labels)
    loss_mask, _ = roll(loss_mask)
    return labels, loss_mask
