"""ROLL's and slime's MTP contracts reproduced by patchkit's options, on the real megatron-core (CPU).

Each reference below is the framework's own ``GPTModel._postprocess`` rewritten from its formulas
(the file and function are cited at each), bound to a second model with the same weights; patchkit's
options run on the first. The same forward and the same objective on both must give the same
output and the same gradient in every parameter: the MTP losses attached train alike.

1. ROLL's RL forward (``labels=None``, a loss mask): MTP labels from ``input_ids``, the mask as given,
   per-token losses unscaled = ``without_labels="derive-mask-as-given", per_token_loss="unscaled"``.
2. ROLL's SFT forward (labels given): the LM loss returned, MTP labels from ``input_ids`` =
   ``with_labels="derive", returns="loss"``.
3. slime's ``mtp_kwargs={"mtp_labels": tokens}`` = ``mtp.enable(model, mtp_kwargs=True,
   per_token_loss="unscaled")`` (output head detached, the default).
4. ``position_ids=None`` through the MTP layers of a RoPE model (slime's and ROLL's RL forwards).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from mtp_checks import ATOL, MCORE, gradients
from packaging.version import Version
from tiny_gpt import VOCAB_SIZE, Batch

import patchkit

pytestmark = pytest.mark.usefixtures("empty_mtp_tracker")


def _mtp_block(model: Any, hidden_states: torch.Tensor, input_ids: torch.Tensor, position_ids: Any,
               attention_mask: Any, rotary: tuple[Any, Any, Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """``self.mtp(...)`` as both frameworks call it; 0.18+ take ``padding_mask`` too."""
    block_kwargs = {name: kwargs[name] for name in ("padding_mask",) if name in kwargs}
    return model.mtp(
        input_ids=input_ids, position_ids=position_ids, hidden_states=hidden_states,
        attention_mask=attention_mask, rotary_pos_emb=rotary[0], rotary_pos_cos=rotary[1],
        rotary_pos_sin=rotary[2], embedding=model.embedding, **block_kwargs,
    )


def _roll(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    return roll_tensor(tensor, shifts=-1, dims=-1, cp_group=None)  # CP=1 here, as self.cp_group is


def _attach(model: Any, hidden_states: torch.Tensor, mtp_loss: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
    """The attach both frameworks share (upstream 0.14-0.16's, with no rescale of per-token losses)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

    config = model.config
    mtp_loss_scale = config.mtp_loss_scaling_factor / config.mtp_num_layers
    if config.calculate_per_token_loss:
        return MTPLossAutoScaler.apply(hidden_states, mtp_loss_scale * mtp_loss)
    return MTPLossAutoScaler.apply(hidden_states, mtp_loss_scale * mtp_loss / num_tokens)


def roll_postprocess(self: Any, hidden_states: torch.Tensor, input_ids: torch.Tensor, position_ids: Any,
                     labels: Any, rotary_pos_emb: Any, rotary_pos_cos: Any, rotary_pos_sin: Any,
                     mtp_in_postprocess: Any = None, loss_mask: Any = None, attention_mask: Any = None,
                     runtime_gather_output: Any = None, **kwargs: Any) -> torch.Tensor:
    """ROLL 8eb27cc, ``roll/third_party/megatron/mtp_patcher.py:patched_gpt_postprocess``, mode ``joint``
    (the output weight not detached), training, CP=1; its tracker logging left out (the numbers
    compared are what it returns and attaches)."""
    output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
    if mtp_in_postprocess:
        hidden_states = _mtp_block(self, hidden_states, input_ids, position_ids, attention_mask,
                                   (rotary_pos_emb, rotary_pos_cos, rotary_pos_sin), kwargs)
    mtp_labels, _ = _roll(input_ids)  # labels from input_ids, whatever labels says
    hidden_states_list = torch.chunk(hidden_states, 1 + self.config.mtp_num_layers, dim=0)
    hidden_states = hidden_states_list[0]
    if loss_mask is None:
        loss_mask = torch.ones_like(mtp_labels)
    for depth in range(self.config.mtp_num_layers):
        mtp_logits, _ = self.output_layer(hidden_states_list[depth + 1], weight=output_weight,
                                          runtime_gather_output=runtime_gather_output)
        mtp_labels, _ = _roll(mtp_labels)
        loss_mask, num_tokens = _roll(loss_mask)  # the mask as given, rolled once per depth only
        mtp_loss = loss_mask * self.compute_language_model_loss(mtp_labels, mtp_logits)
        hidden_states = _attach(self, hidden_states, mtp_loss, max(num_tokens, 1))
    logits, _ = self.output_layer(hidden_states, weight=output_weight, runtime_gather_output=runtime_gather_output)
    if labels is None:
        return logits.transpose(0, 1).contiguous()
    return self.compute_language_model_loss(labels, logits)


def slime_postprocess(mtp_labels_given: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    """slime 624b824, ``docker/patch/latest/megatron.patch``, ``gpt_model.py`` ``GPTModel._postprocess``
    over Megatron-LM ``1dcf0daf``'s inline MTP loss; ``mtp_labels_given`` is what slime's
    ``forward_step`` (``slime/backends/megatron_utils/model.py``) passes as ``mtp_kwargs["mtp_labels"]``.
    Training, CP=1, tracker logging left out."""

    def postprocess(self: Any, hidden_states: torch.Tensor, input_ids: torch.Tensor, position_ids: Any,
                    labels: Any, rotary_pos_emb: Any, rotary_pos_cos: Any, rotary_pos_sin: Any,
                    mtp_in_postprocess: Any = None, loss_mask: Any = None, attention_mask: Any = None,
                    runtime_gather_output: Any = None, **kwargs: Any) -> torch.Tensor:
        mtp_labels = mtp_labels_given
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        if mtp_in_postprocess and mtp_labels is not None:
            hidden_states = _mtp_block(self, hidden_states, input_ids, position_ids, attention_mask,
                                       (rotary_pos_emb, rotary_pos_cos, rotary_pos_sin), kwargs)
        if self.config.mtp_num_layers and mtp_labels is not None:
            mtp_labels, _ = _roll(mtp_labels.clone())
            hidden_states_list = torch.chunk(hidden_states, 1 + self.config.mtp_num_layers, dim=0)
            hidden_states = hidden_states_list[0]
            if loss_mask is None:
                loss_mask = torch.ones_like(mtp_labels)
            else:
                loss_mask, _ = _roll(loss_mask)
            mtp_output_weight = output_weight if output_weight is not None else self.output_layer.weight
            mtp_output_weight = mtp_output_weight.detach()
            for depth in range(self.config.mtp_num_layers):
                mtp_labels, _ = _roll(mtp_labels)
                loss_mask, num_tokens = _roll(loss_mask)
                mtp_logits, _ = self.output_layer(hidden_states_list[depth + 1], weight=mtp_output_weight,
                                                  runtime_gather_output=runtime_gather_output)
                mtp_loss = loss_mask * self.compute_language_model_loss(mtp_labels, mtp_logits)
                hidden_states = _attach(self, hidden_states, mtp_loss, num_tokens)
        elif not mtp_in_postprocess:
            hidden_states = torch.chunk(hidden_states, 1 + self.config.mtp_num_layers, dim=0)[0]
        logits, _ = self.output_layer(hidden_states, weight=output_weight, runtime_gather_output=runtime_gather_output)
        if labels is None:
            return logits.transpose(0, 1).contiguous()
        return self.compute_language_model_loss(labels, logits)

    return postprocess


def _pair(tiny_gpt: Callable[..., Any], reference: Callable[..., torch.Tensor], **config: Any) -> tuple[Any, Any]:
    """Two models with the same weights: patchkit's, and one whose ``_postprocess`` is ``reference``."""
    ours, theirs = tiny_gpt(mtp_num_layers=2, **config), tiny_gpt(mtp_num_layers=2, **config)
    theirs.load_state_dict(ours.state_dict())
    theirs._postprocess = types.MethodType(reference, theirs)
    return ours, theirs


def _objective(output: torch.Tensor) -> torch.Tensor:
    """A fixed function of what the forward returns, the same for both models."""
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(5))
    return (output.float() * weights).sum()


def _assert_same_forward_and_gradients(ours: Any, theirs: Any, forward: Callable[[Any], torch.Tensor]) -> None:
    got, want = forward(ours), forward(theirs)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    _objective(got).backward()
    _objective(want).backward()
    ours_grads, theirs_grads = gradients(ours), gradients(theirs)
    assert ours_grads.keys() == theirs_grads.keys()
    assert any(name.startswith("mtp.") for name in ours_grads)
    for name, grad in ours_grads.items():
        # rtol: per-token gradients reach ~1e2 here, and 0.17+'s rescale (undone in the gradient) rounds.
        torch.testing.assert_close(grad, theirs_grads[name], atol=ATOL, rtol=1e-6, msg=name)


def _rl_forward(batch: Batch) -> Callable[[Any], torch.Tensor]:
    """ROLL's ``megatron_strategy.py:inner_forward_step`` for RL: no labels, the response mask as loss mask."""
    return lambda model: model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=None,
                               loss_mask=batch.loss_mask)


@pytest.mark.parametrize("per_token", [False, True])
def test_roll_rl_forward_equals_without_labels_derive_mask_as_given_unscaled(
    tiny_gpt: Callable[..., Any], batch: Batch, per_token: bool
) -> None:
    from patchkit.patches.megatron import mtp

    ours, theirs = _pair(tiny_gpt, roll_postprocess, calculate_per_token_loss=per_token)
    mtp.enable(ours, without_labels="derive-mask-as-given", per_token_loss="unscaled", output_head="trained")
    _assert_same_forward_and_gradients(ours, theirs, _rl_forward(batch))


def test_roll_rl_forward_differs_from_0_19s_derivation_and_from_the_rescaled_weighting(
    tiny_gpt: Callable[..., Any], batch: Batch
) -> None:
    """What the two new choices change: each of the older ones gives other gradients on ROLL's call."""
    from patchkit.patches.megatron import mtp

    for options in ({"without_labels": "derive", "per_token_loss": "unscaled"},
                    {"without_labels": "derive-mask-as-given", "per_token_loss": "rescaled"}):
        ours, theirs = _pair(tiny_gpt, roll_postprocess, calculate_per_token_loss=True)
        mtp.enable(ours, output_head="trained", **options)
        with pytest.raises(AssertionError):
            _assert_same_forward_and_gradients(ours, theirs, _rl_forward(batch))


def test_roll_sft_forward_returns_the_lm_loss_with_mtp_labels_from_input_ids(
    tiny_gpt: Callable[..., Any], batch: Batch
) -> None:
    from patchkit.patches.megatron import mtp

    ours, theirs = _pair(tiny_gpt, roll_postprocess)
    mtp.enable(ours, with_labels="derive", returns="loss", per_token_loss="unscaled", output_head="trained")
    other_labels = (batch.labels + 3) % VOCAB_SIZE  # an SFT batch's labels need not be the shifted ids

    def sft_forward(model: Any) -> torch.Tensor:
        return model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=other_labels,
                     loss_mask=batch.loss_mask)

    _assert_same_forward_and_gradients(ours, theirs, sft_forward)
    assert sft_forward(ours).shape == batch.labels.shape  # [b, s]: the loss, not logits


@pytest.mark.parametrize("per_token", [False, True])
def test_slime_mtp_kwargs_forward_equals_mtp_kwargs_option(
    tiny_gpt: Callable[..., Any], batch: Batch, per_token: bool
) -> None:
    from patchkit.patches.megatron import mtp

    tokens = batch.input_ids  # slime's forward_step: mtp_kwargs = {"mtp_labels": batch["tokens"]}
    ours, theirs = _pair(tiny_gpt, slime_postprocess(tokens), calculate_per_token_loss=per_token)
    mtp.enable(ours, mtp_kwargs=True, per_token_loss="unscaled")
    forward_kwargs = dict(labels=None, loss_mask=batch.loss_mask)

    _assert_same_forward_and_gradients(
        ours, theirs,
        lambda model: model(batch.input_ids, batch.position_ids, batch.attention_mask, **forward_kwargs,
                            **({"mtp_kwargs": {"mtp_labels": tokens}} if model is ours else {})),
    )
    assert ours.output_layer.weight.grad is not None


def test_slime_forward_without_mtp_labels_runs_no_mtp_and_bad_keys_are_refused(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor]
) -> None:
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=2)
    mtp.enable(model, mtp_kwargs=True)
    model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels, loss_mask=batch.loss_mask)
    model(batch.input_ids, batch.position_ids, batch.attention_mask, loss_mask=batch.loss_mask, mtp_kwargs={})
    assert attached_mtp_losses == []  # slime's contract: no mtp_labels, no MTP, labels or not
    model(batch.input_ids, batch.position_ids, batch.attention_mask, loss_mask=batch.loss_mask,
          mtp_kwargs={"mtp_labels": batch.input_ids})
    assert len(attached_mtp_losses) == 2
    with pytest.raises(mtp.MTPOptionError, match="mtp_labels"):
        model(batch.input_ids, batch.position_ids, batch.attention_mask, mtp_kwargs={"labels": batch.labels})
    mtp.enable(model)  # mtp_kwargs off again: upstream's forward, which takes no such keyword
    with pytest.raises(TypeError):
        model(batch.input_ids, batch.position_ids, batch.attention_mask, mtp_kwargs={"mtp_labels": batch.input_ids})
    mtp.enable(model, mtp_kwargs=True)
    mtp.disable(model)
    assert "forward" not in vars(model)


def test_new_options_refuse_unknown_choices_before_changing_the_model(tiny_gpt: Callable[..., Any]) -> None:
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=1)
    for option, bad in (("per_token_loss", "legacy"), ("returns", "both"), ("without_labels", "derive-mask")):
        with pytest.raises(mtp.MTPOptionError, match=option):
            mtp.enable(model, **{option: bad})
    assert "_postprocess" not in vars(model)


def test_configure_sets_the_new_options_as_the_process_default(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor]
) -> None:
    from patchkit.patches.megatron import mtp
    from patchkit.patches.megatron.mtp import _options as _mtp_options

    model = tiny_gpt(mtp_num_layers=1)
    try:
        with pytest.raises(mtp.MTPOptionError, match="per_token_loss"):
            mtp.configure(returns="loss", per_token_loss="legacy")
        assert mtp.options_for(model).returns == "logits"  # a bad value changed nothing
        mtp.configure(without_labels="derive-mask-as-given", per_token_loss="unscaled", returns="loss")
        with patchkit.applied("megatron.mtp_postprocess"):
            loss = model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels,
                         loss_mask=batch.loss_mask)
            logits = model(batch.input_ids, batch.position_ids, batch.attention_mask, loss_mask=batch.loss_mask)
        assert loss.shape == batch.labels.shape and logits.shape == (*batch.labels.shape, VOCAB_SIZE)
        assert len(attached_mtp_losses) == 2  # labels given, then derived from the ids
    finally:
        _mtp_options.reset_default()


def _rope_forward(batch: Batch, position_ids: torch.Tensor | None) -> Callable[[Any], torch.Tensor]:
    return lambda model: model(batch.input_ids, position_ids, batch.attention_mask, labels=batch.labels,
                               loss_mask=batch.loss_mask)


def test_position_ids_none_runs_the_mtp_layers_of_a_rope_model_as_given_positions(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor]
) -> None:
    model = tiny_gpt(mtp_num_layers=2, position_embedding_type="rope")
    if MCORE < Version("0.19"):  # upstream rolls position_ids unconditionally before 0.19
        with pytest.raises((TypeError, AttributeError)):
            _rope_forward(batch, None)(model)
    attached_mtp_losses.clear()
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_detach_inputs"):
        with_positions = _rope_forward(batch, batch.position_ids)(model)
        given = list(attached_mtp_losses)
        attached_mtp_losses.clear()
        without = _rope_forward(batch, None)(model)
        absent = list(attached_mtp_losses)
    torch.testing.assert_close(without, with_positions, atol=0, rtol=0)  # RoPE reads no position ids
    assert len(given) == len(absent) == 2
    for depth, (got, want) in enumerate(zip(absent, given, strict=True)):
        torch.testing.assert_close(got, want, atol=0, rtol=0, msg=f"depth {depth + 1}")


def test_position_ids_none_works_with_the_inputs_left_attached(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor]
) -> None:
    """A model enabled with ``detach_inputs=False`` under the process-wide patch: no detach, None still works."""
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=1, position_embedding_type="rope")
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_detach_inputs"):
        mtp.enable(model, detach_inputs=False, output_head="trained")
        _rope_forward(batch, None)(model).float().sum().mul(0).backward()
    assert len(attached_mtp_losses) == 1
    assert model.embedding.word_embeddings.weight.grad is not None  # the MTP loss reached the embedding


def test_position_ids_none_is_left_to_upstream_for_a_learned_position_embedding(
    tiny_gpt: Callable[..., Any], batch: Batch
) -> None:
    model = tiny_gpt(mtp_num_layers=1)  # learned absolute positions: the ids are read, None cannot work
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_detach_inputs"):
        with pytest.raises((TypeError, AttributeError)):  # the embedding reads the absent ids
            _rope_forward(batch, None)(model)
