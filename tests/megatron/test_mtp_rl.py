"""The MTP fixes RL frameworks carry, against the real megatron-core on CPU.

Output head detached for the MTP loss (verl #6432, slime), no NaN on a rank or micro-batch
without loss tokens (verl #6464), dynamic CP group from the batch, per-model enablement, recompute
with non-tensor arguments, and megatron-core main's sequence-parallel scatter in
``_get_embeddings``. fp32; expected numbers from upstream run on the same weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from mtp_checks import (
    ATOL,
    MCORE,
    OUTPUT_WEIGHT,
    assert_all_gradients_finite,
    assert_output_head_untouched_and_mtp_trains,
    check_option_from_environment,
    grad_magnitude,
    mtp_only_backward,
    mtp_parameters,
    output_head,
    run,
    token_loss_from_logits,
)
from packaging.version import Version

# The same drivers as the self-check (``check_mtp_recompute``): one piece of code.
from patchkit.patches.megatron.mtp._checks._mtp_recompute_probe import (
    RECOMPUTE,
    checkpointed_call_grad,
    mtp_layer_grads,
)
from tiny_gpt import VOCAB_SIZE, Batch

import patchkit

pytestmark = pytest.mark.usefixtures("empty_mtp_tracker")


# 1. The MTP loss leaves the output head alone (default), upstream's choice kept.


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_mtp_loss_leaves_output_head_alone_by_default(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    with patchkit.applied("megatron.mtp_postprocess"):
        mtp_only_backward(model, batch)
    assert_output_head_untouched_and_mtp_trains(model)


def test_trained_output_head_is_upstreams_choice(tiny_gpt: Callable[..., Any], batch: Batch) -> None:
    model = tiny_gpt(mtp_num_layers=1)
    with output_head("trained"), patchkit.applied("megatron.mtp_postprocess"):
        mtp_only_backward(model, batch)
    patched = model.output_layer.weight.grad.detach().clone()
    model.zero_grad(set_to_none=True)
    # Upstream: its LM loss * 0 plus the MTP loss it attaches. Same MTP-only gradient on the head.
    (run(model, batch) * 0.0).sum().backward()
    torch.testing.assert_close(patched, model.output_layer.weight.grad, atol=ATOL, rtol=0)
    assert float(patched.abs().sum()) > 0


def test_detached_output_head_keeps_the_mtp_loss_value(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor]
) -> None:
    model = tiny_gpt(mtp_num_layers=2)
    for head in ("trained", "detached"):
        with output_head(head), patchkit.applied("megatron.mtp_postprocess"):
            run(model, batch)
    trained, detached = attached_mtp_losses[:2], attached_mtp_losses[2:]
    for ours, theirs in zip(detached, trained, strict=True):
        assert torch.equal(ours, theirs)


def _swap_in_biased_output_layer(model: Any) -> torch.nn.Parameter:
    """Upstream's GPTModel builds its output layer with ``bias=False``; a model may swap in its own."""
    from megatron.core.tensor_parallel import ColumnParallelLinear

    assert model.output_layer.bias is None, "upstream's GPTModel output layer has no bias"
    head = ColumnParallelLinear(
        model.config.hidden_size, VOCAB_SIZE, config=model.config, init_method=model.config.init_method,
        bias=True, skip_bias_add=False, gather_output=False,
    )
    with torch.no_grad():
        head.weight.copy_(model.output_layer.weight)
        head.bias.normal_(generator=torch.Generator().manual_seed(3))
    model.output_layer = head
    return head.bias


def test_output_layer_bias_is_detached_not_dropped(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor]
) -> None:
    model = tiny_gpt(mtp_num_layers=1)
    bias = _swap_in_biased_output_layer(model)
    with output_head("trained"), patchkit.applied("megatron.mtp_postprocess"):
        mtp_only_backward(model, batch)
    assert grad_magnitude(bias) > 0, "with the head trained, the MTP loss must reach the bias"
    model.zero_grad(set_to_none=True)
    with patchkit.applied("megatron.mtp_postprocess"):
        mtp_only_backward(model, batch)
    assert grad_magnitude(bias) == 0.0
    assert_output_head_untouched_and_mtp_trains(model)
    # The bias is still in the MTP logits: the attached loss is the same number either way.
    assert torch.equal(attached_mtp_losses[0], attached_mtp_losses[1])


def test_output_head_option_rejects_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from patchkit.patches.megatron.mtp import _options as _mtp_options

    with pytest.raises(_mtp_options.MTPOptionError, match="detached, trained"):
        _mtp_options.configure(output_head="frozen")
    check_option_from_environment(monkeypatch, "PATCHKIT_MTP_OUTPUT_HEAD", "Trained", "output_head", "trained")


# 2. No NaN when a micro-batch (or a CP rank: test_mtp_context_parallel.py) has no loss token.


@pytest.mark.parametrize("calculate_per_token_loss", [False, True])
@pytest.mark.parametrize("head", ["trained", "detached"])
def test_all_zero_loss_mask_gives_finite_loss_and_gradients(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor], head: str,
    calculate_per_token_loss: bool,
) -> None:
    model = tiny_gpt(mtp_num_layers=2, calculate_per_token_loss=calculate_per_token_loss)
    empty = dataclasses.replace(batch, loss_mask=torch.zeros_like(batch.loss_mask))
    with output_head(head), patchkit.applied("megatron.mtp_postprocess"):
        logits = run(model, empty)
        loss = (token_loss_from_logits(model, empty, logits) * empty.loss_mask).sum()
        loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(attached).all() for attached in attached_mtp_losses)
    assert_all_gradients_finite(model)
    assert any(p.grad is not None for p in mtp_parameters(model).values())


# 4. The CP group of a dynamic-CP batch (packed_seq_params.cp_group, 0.16+).


@pytest.mark.skipif(MCORE < Version("0.16"), reason="PackedSeqParams has no cp_group before 0.16")
def test_mtp_loss_rolls_over_the_batchs_cp_group(
    tiny_gpt: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer import multi_token_prediction as mtp_module

    model = tiny_gpt(mtp_num_layers=1)
    dynamic_group = torch.distributed.new_group(ranks=[0], backend="gloo")
    assert dynamic_group is not model.pg_collection.cp if hasattr(model, "pg_collection") else True
    groups_used: list[Any] = []
    original_roll = mtp_module.roll_tensor

    def recording_roll(*args: Any, cp_group: Any = None, **kwargs: Any) -> Any:
        groups_used.append(cp_group)
        return original_roll(*args, cp_group=cp_group, **kwargs)

    # Both the 0.14-0.16 loop (its module global) and upstream's process_mtp_loss (0.17+) roll here.
    monkeypatch.setattr(mtp_module, "roll_tensor", recording_roll)
    from patchkit.patches.megatron.mtp._mtp_postprocess import v014 as _mtp_postprocess_v014

    monkeypatch.setattr(_mtp_postprocess_v014, "roll_tensor", recording_roll, raising=False)
    cu_seqlens = torch.tensor([0, 7, 16], dtype=torch.int32)
    packed = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens, max_seqlen_q=9, max_seqlen_kv=9,
        cp_group=dynamic_group,
    )
    generator = torch.Generator().manual_seed(5)
    labels = torch.randint(0, VOCAB_SIZE, (1, 16), generator=generator)
    with patchkit.applied("megatron.mtp_postprocess"):
        model._postprocess(
            hidden_states=torch.randn(32, 1, 64, generator=generator), input_ids=labels, position_ids=None,
            labels=labels, rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None,
            mtp_in_postprocess=False, loss_mask=torch.ones(1, 16), packed_seq_params=packed,
        )
    assert groups_used, "the MTP loss rolled nothing"
    assert all(group is dynamic_group for group in groups_used), groups_used


# 5. Per-model enablement: the policy model patched, a frozen reference model upstream's.


def test_enable_per_model_leaves_the_reference_model_upstream(tiny_gpt: Callable[..., Any], batch: Batch) -> None:
    from megatron.core.models.gpt.gpt_model import GPTModel
    from patchkit.patches.megatron import mtp

    class_postprocess = GPTModel.__dict__["_postprocess"]
    policy, reference = tiny_gpt(mtp_num_layers=1, seed=0), tiny_gpt(mtp_num_layers=1, seed=1)
    upstream_reference_loss = run(reference, batch).detach()
    assert mtp.enable([policy], detach_inputs=True) == [policy]
    assert GPTModel.__dict__["_postprocess"] is class_postprocess  # the class is untouched

    logits = run(policy, batch)
    assert logits.shape == (*batch.labels.shape, VOCAB_SIZE)
    assert torch.equal(run(reference, batch).detach(), upstream_reference_loss)

    (logits * 0.0).sum().backward()
    assert_output_head_untouched_and_mtp_trains(policy)
    assert grad_magnitude(policy.embedding.word_embeddings.weight) == 0.0  # detach_inputs for this model

    # Reference: upstream's loss path, its MTP loss still training its output head.
    (run(reference, batch) * 0.0).sum().backward()
    assert grad_magnitude(reference.output_layer.weight) > 0
    assert grad_magnitude(reference.embedding.word_embeddings.weight) > 0


def test_disable_keeps_a_model_upstream_under_the_global_patch(
    tiny_gpt: Callable[..., Any], batch: Batch
) -> None:
    from patchkit.patches.megatron import mtp

    policy, reference = tiny_gpt(mtp_num_layers=1, seed=0), tiny_gpt(mtp_num_layers=1, seed=1)
    upstream_reference_loss = run(reference, batch).detach()
    mtp.disable(reference)
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_detach_inputs"):
        assert run(policy, batch).shape == (*batch.labels.shape, VOCAB_SIZE)
        assert torch.equal(run(reference, batch).detach(), upstream_reference_loss)
        (run(reference, batch) * 0.0).sum().backward()
    assert grad_magnitude(reference.embedding.word_embeddings.weight) > 0  # not detached either


def test_enable_per_model_takes_wrappers_and_options(tiny_gpt: Callable[..., Any], batch: Batch) -> None:
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=1)

    class Wrapper(torch.nn.Module):
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

    assert mtp.enable(Wrapper(model), output_head="trained") == [model]
    assert mtp.options_for(model).output_head == "trained"
    mtp_only_backward(model, batch)
    assert grad_magnitude(model.output_layer.weight) > 0
    with pytest.raises(mtp.MTPModelError, match="GPTModel"):
        mtp.enable(torch.nn.Linear(2, 2))
    with pytest.raises(mtp.MTPOptionError):
        mtp.enable(model, output_head="sideways")


# 6. Recompute: the MTP layer's checkpointed forward with non-tensor arguments.


def test_recompute_patch_applies_below_019_and_is_native_after(megatron_cpu: None) -> None:
    with patchkit.applied("megatron.mtp_recompute") as records:
        (record,) = records
    if MCORE >= Version("0.19"):
        assert (record.state.value, record.reason.value, record.variant) == ("skipped", "native", "native-0.19")
    else:
        expected = "accept-padding-mask" if MCORE >= Version("0.18") else "closure-non-tensor-args"
        assert (record.state.value, record.variant) == ("applied", expected), record


@pytest.mark.skipif(MCORE >= Version("0.18"), reason="0.18 rewrote the method (forward_func no longer passed)")
def test_checkpointed_mtp_forward_takes_non_tensor_arguments(tiny_gpt: Callable[..., Any]) -> None:
    layer = tiny_gpt(mtp_num_layers=1, **RECOMPUTE).mtp.layers[0]
    with pytest.raises(TypeError, match="save_for_backward"):  # upstream's failure, reproduced
        checkpointed_call_grad(layer)
    with patchkit.applied("megatron.mtp_recompute"):
        grad = checkpointed_call_grad(layer)
    assert torch.equal(grad, torch.full_like(grad, 3.0))


@pytest.mark.skipif(MCORE < Version("0.16"), reason="0.14/0.15 refuse packed sequences in the MTP layer")
def test_recomputed_mtp_layer_runs_packed_sequences(tiny_gpt: Callable[..., Any]) -> None:
    if MCORE < Version("0.18"):
        with pytest.raises(TypeError, match="save_for_backward"):  # upstream's failure, reproduced
            mtp_layer_grads(tiny_gpt(mtp_num_layers=1, **RECOMPUTE), packed=True)
    with patchkit.applied("megatron.mtp_recompute"):
        recomputed = mtp_layer_grads(tiny_gpt(mtp_num_layers=1, **RECOMPUTE), packed=True)
        plain = mtp_layer_grads(tiny_gpt(mtp_num_layers=1), packed=True)
    assert recomputed.keys() == plain.keys() and plain
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, atol=ATOL, rtol=0, msg=name)


@pytest.mark.skipif(MCORE < Version("0.18"), reason="padding_mask reaches the MTP layer from 0.18")
@pytest.mark.parametrize("masked", [False, True])
def test_recomputed_mtp_layer_takes_a_padding_mask(tiny_gpt: Callable[..., Any], masked: bool) -> None:
    # 0.18's forward hands padding_mask to a _checkpointed_forward that does not take it: TypeError on
    # every MTP recompute, mask or not. 0.19 takes it (native).
    def mtp_grads(model: Any) -> dict[str, torch.Tensor]:
        return mtp_layer_grads(model, padding_mask=masked, batch_size=2)

    if MCORE < Version("0.19"):
        with pytest.raises(TypeError, match="padding_mask"):  # upstream's failure, reproduced
            mtp_grads(tiny_gpt(mtp_num_layers=1, **RECOMPUTE))
    with patchkit.applied("megatron.mtp_recompute"):
        recomputed = mtp_grads(tiny_gpt(mtp_num_layers=1, **RECOMPUTE))
    plain = mtp_grads(tiny_gpt(mtp_num_layers=1))
    assert plain and recomputed.keys() == plain.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, atol=ATOL, rtol=0, msg=name)


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_recomputed_mtp_layers_get_the_same_gradients(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:
    recompute = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    plain, recomputed = tiny_gpt(mtp_num_layers=mtp_num_layers), tiny_gpt(mtp_num_layers=mtp_num_layers, **recompute)
    grads = []
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_recompute"):
        for model in (plain, recomputed):
            logits = run(model, batch)
            (token_loss_from_logits(model, batch, logits) * batch.loss_mask).sum().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=ATOL, rtol=0, msg=name)
    assert OUTPUT_WEIGHT in grads[0]


# 7. megatron-core main (0.20): _get_embeddings scatters decoder_input for sequence parallelism.


@pytest.mark.skipif(MCORE < Version("0.20"), reason="the sequence-parallel scatter is new in 0.20")
def test_detach_inputs_holds_through_the_sequence_parallel_scatter(
    tiny_gpt: Callable[..., Any], batch: Batch, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.core.transformer import multi_token_prediction as mtp_module

    model = tiny_gpt(mtp_num_layers=1)
    layer = model.mtp.layers[0]
    scatters: list[torch.Tensor] = []
    original_scatter = mtp_module.scatter_to_sequence_parallel_region

    def recording_scatter(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        scatters.append(tensor)
        return original_scatter(tensor, *args, **kwargs)

    monkeypatch.setattr(mtp_module, "scatter_to_sequence_parallel_region", recording_scatter)
    # The branch a multimodal LM takes: its embedding skips the scatter, the MTP layer does it.
    monkeypatch.setattr(model.embedding, "scatter_to_sequence_parallel", False, raising=False)
    monkeypatch.setattr(layer.config, "sequence_parallel", True)
    hidden = torch.randn(batch.input_ids.shape[1], batch.input_ids.shape[0], 64, requires_grad=True)

    def embeddings() -> tuple:
        return layer._get_embeddings(input_ids=batch.input_ids, position_ids=batch.position_ids,
                                     embedding=model.embedding, hidden_states=hidden)

    *_, upstream_input, _ = embeddings()
    assert len(scatters) == 1 and upstream_input.requires_grad
    with patchkit.applied("megatron.mtp_detach_inputs"):
        *_, decoder_input, hidden_out = embeddings()
    assert len(scatters) == 2, "the scatter branch was not taken"
    assert not decoder_input.requires_grad and torch.equal(decoder_input, upstream_input.detach())
    hidden_out.sum().backward()
    assert hidden.grad is None
