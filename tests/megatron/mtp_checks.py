"""Shared checks for the MTP patch tests (CPU and GPU): run the model, read what upstream computed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from importlib.metadata import version
from typing import Any

import pytest
import torch
from packaging.version import Version
from tiny_gpt import Batch

#: The installed megatron-core release, which the MTP tests branch on.
MCORE = Version(version("megatron-core"))

ATOL = 1e-5


def tracked_mtp_losses() -> torch.Tensor:
    """Per-depth MTP losses upstream logs (``values`` up to 0.18, ``loss_values`` from 0.19)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    tracker = MTPLossLoggingHelper.tracker
    values = tracker.get("loss_values", tracker.get("values"))
    assert values is not None, f"upstream logged no MTP loss; tracker keys: {sorted(tracker)}"
    return values.detach().clone()


def run(model: Any, batch: Batch, *, labels: bool = True) -> torch.Tensor:
    return model(
        batch.input_ids,
        batch.position_ids,
        batch.attention_mask,
        labels=batch.labels if labels else None,
        loss_mask=batch.loss_mask,
    )


def token_loss_from_logits(model: Any, batch: Batch, logits: torch.Tensor) -> torch.Tensor:
    """What an RL trainer would do with the returned logits: upstream's own per-token CE."""
    return model.compute_language_model_loss(batch.labels, logits.transpose(0, 1).contiguous())


def gradients(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def mtp_parameters(model: Any) -> dict[str, torch.nn.Parameter]:
    params = {n: p for n, p in model.named_parameters() if n.startswith("mtp.")}
    assert params, "the model has no MTP parameters"
    return params


def outcome(call: Callable[[], torch.Tensor]) -> torch.Tensor | type[BaseException]:
    try:
        return call().detach()
    except Exception as error:  # upstream itself may refuse; the patch must refuse alike
        return type(error)


def assert_attached_mtp_losses_match_upstream(
    model: Any, batch: Batch, attached: list[torch.Tensor], mtp_num_layers: int
) -> None:
    """Run unpatched then patched on the same weights; attached and logged MTP losses must agree."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    import patchkit

    run(model, batch)
    upstream_attached = list(attached)
    upstream_tracked = tracked_mtp_losses()
    attached.clear()
    MTPLossLoggingHelper.tracker.clear()

    with patchkit.applied("megatron.mtp_postprocess"):
        run(model, batch)
    assert len(upstream_attached) == mtp_num_layers
    assert len(attached) == mtp_num_layers
    for depth, (ours, theirs) in enumerate(zip(attached, upstream_attached, strict=True)):
        assert ours.abs().sum() > 0, f"depth {depth + 1} attached an all-zero loss"
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=f"depth {depth + 1}")
    torch.testing.assert_close(tracked_mtp_losses(), upstream_tracked, atol=ATOL, rtol=0)


OUTPUT_WEIGHT = "output_layer.weight"


@contextlib.contextmanager
def output_head(choice: str) -> Iterator[None]:
    """The process-wide MTP output-head option set to ``choice`` for the block."""
    from patchkit.patches.megatron.mtp import _options as _mtp_options

    _mtp_options.configure(output_head=choice)
    try:
        yield
    finally:
        _mtp_options.reset_default()


def assert_trainer_gradients_match_upstream(model: Any, batch: Batch, head: str = "trained") -> None:
    """Upstream's loss path and (patched logits -> upstream CE) must give the same gradients.

    With ``head="trained"`` (upstream's choice) every gradient equals upstream's. With
    ``"detached"`` every gradient but the output layer's equals upstream's, and the output layer's
    differs from upstream's (which includes the MTP loss's share).
    """
    import patchkit

    (run(model, batch) * batch.loss_mask).sum().backward()
    upstream_grads = gradients(model)
    model.zero_grad(set_to_none=True)

    with output_head(head), patchkit.applied("megatron.mtp_postprocess"):
        logits = run(model, batch)
        (token_loss_from_logits(model, batch, logits) * batch.loss_mask).sum().backward()
        ours = gradients(model)
    assert ours.keys() == upstream_grads.keys() == {n for n, _ in model.named_parameters()}
    for name, grad in ours.items():
        if head == "detached" and name == OUTPUT_WEIGHT:
            continue
        torch.testing.assert_close(grad, upstream_grads[name], atol=ATOL, rtol=0, msg=name)
    if head == "detached":
        with torch.no_grad():
            mtp_share = upstream_grads[OUTPUT_WEIGHT] - ours[OUTPUT_WEIGHT]
        assert float(mtp_share.abs().sum()) > 0, "upstream's MTP loss should have moved the output layer"


def mtp_only_backward(model: Any, batch: Batch) -> None:
    """A trainer loss that ignores the logits: every gradient afterwards is the attached MTP loss's."""
    (run(model, batch) * 0.0).sum().backward()


def grad_magnitude(param: torch.nn.Parameter) -> float:
    return 0.0 if param.grad is None else float(param.grad.abs().sum())


def assert_output_head_untouched_and_mtp_trains(model: Any) -> None:
    for name, param in model.named_parameters():
        if name.startswith("output_layer."):
            assert grad_magnitude(param) == 0.0, f"{name} got MTP gradient {grad_magnitude(param)}"
    for name, param in mtp_parameters(model).items():
        assert grad_magnitude(param) > 0, f"{name} got no gradient from the MTP loss"


def assert_all_gradients_finite(model: Any) -> None:
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {bad}"


def context_parallel_zero_mask_rank(
    rank: int, world_size: int, init_method: str, patched: bool, backend: str = "gloo"
) -> tuple[bool, bool]:
    """One rank of a CP=2 job (``tests/_multiprocess.spawn_ranks``; gloo on CPU, or NCCL with one GPU a
    rank): rank 1 holds only masked tokens; returns whether its loss and gradients are finite and
    whether its MTP layers trained.

    The local (non-TE) attention cannot run context parallelism, so the decoder is left out: the
    main hidden states are a leaf standing in for the decoder's output shard, and the postprocess
    runs upstream's MTP block (its embedding roll over the CP group included) and the MTP loss.
    """
    from _multiprocess import init_rank
    from cpu_harness import cpu_megatron
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from tiny_gpt import build_tiny_gpt, make_batch

    import patchkit

    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    init_rank(rank, world_size, init_method, backend)
    try:
        with cpu_megatron() if backend == "gloo" else contextlib.nullcontext():
            parallel_state.initialize_model_parallel(context_parallel_size=2)
            model_parallel_cuda_manual_seed(1234)
            model = build_tiny_gpt(mtp_num_layers=1).to(device)
            batch = make_batch(seq_len=16)
            # Upstream's CP layout: each rank holds chunks (rank, 2*cp-1-rank) of 4.
            chunks = [slice(4 * i, 4 * i + 4) for i in (rank, 3 - rank)]

            def shard(t: torch.Tensor) -> torch.Tensor:
                return torch.cat([t[:, c] for c in chunks], dim=1).to(device)

            loss_mask = shard(batch.loss_mask) * (0.0 if rank == 1 else 1.0)
            if rank == 0:
                loss_mask[:, 4] = 0.0  # chunk 3's first token rolls into rank 1's shard: mask it too
            hidden = torch.randn(8, batch.input_ids.shape[0], 64, generator=torch.Generator().manual_seed(rank))
            hidden = hidden.to(device).requires_grad_()
            causal = torch.ones(8, 8, dtype=torch.bool, device=device).triu(1).view(1, 1, 8, 8)
            context = patchkit.applied("megatron.mtp_postprocess") if patched else contextlib.nullcontext()
            with context:
                logits = model._postprocess(
                    hidden_states=hidden, input_ids=shard(batch.input_ids), position_ids=shard(batch.position_ids),
                    labels=shard(batch.labels), rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None,
                    mtp_in_postprocess=True, loss_mask=loss_mask, attention_mask=causal,
                )
            if not patched:  # upstream returns the LM loss; make it a trainer-style sum
                loss = (logits * loss_mask).sum()
            else:
                per_token = model.compute_language_model_loss(shard(batch.labels), logits.transpose(0, 1).contiguous())
                loss = (per_token * loss_mask).sum()
            loss.backward()
            finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(hidden.grad).all()) and all(
                torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
            )
            mtp_trained = any(p.grad is not None and p.grad.abs().sum() > 0
                              for n, p in model.named_parameters() if n.startswith("mtp."))
            parallel_state.destroy_model_parallel()
            return finite, mtp_trained
    finally:
        torch.distributed.destroy_process_group()


def tensor_parallel_mtp_rank(rank: int, world_size: int, init_method: str) -> tuple[bool, float, bool, bool]:
    """One rank of a TP=2 gloo job (vocab-parallel output layer, ``tests/_multiprocess.spawn_ranks``):
    MTP losses and head gradients.

    Reports, per rank: whether the attached MTP losses equal upstream's (same model, unpatched
    run first), the output-layer shard's MTP-only gradient magnitude with the head detached
    (default) and trained, and whether every MTP parameter got gradient.
    """
    from _multiprocess import init_rank
    from cpu_harness import cpu_megatron
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper
    from mtp_loss_reference import recording_attached_losses
    from tiny_gpt import build_tiny_gpt, make_batch

    import patchkit

    init_rank(rank, world_size, init_method)
    try:
        with recording_attached_losses() as attached, cpu_megatron():
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
            model_parallel_cuda_manual_seed(1234)
            model = build_tiny_gpt(mtp_num_layers=2, tensor_model_parallel_size=2)
            batch = make_batch()
            run(model, batch)
            upstream = list(attached)
            attached.clear()
            head_grads = {}
            for head in ("detached", "trained"):
                model.zero_grad(set_to_none=True)
                with output_head(head), patchkit.applied("megatron.mtp_postprocess"):
                    mtp_only_backward(model, batch)
                head_grads[head] = grad_magnitude(model.output_layer.weight)
            equal = len(attached) == 2 * len(upstream) and all(
                torch.allclose(ours, theirs, atol=ATOL, rtol=0)
                for ours, theirs in zip(attached, upstream * 2, strict=True)
            )
            mtp_trained = all(grad_magnitude(p) > 0 for p in mtp_parameters(model).values())
            MTPLossLoggingHelper.tracker.clear()
            parallel_state.destroy_model_parallel()
            return equal, head_grads["detached"], head_grads["trained"] > 0, mtp_trained
    finally:
        torch.distributed.destroy_process_group()


def check_option_from_environment(monkeypatch: Any, variable: str, value: str, field: str, expected: str) -> None:
    """``variable=value`` sets the process default ``field`` (case folded); a value outside the choices
    is a typed error naming the variable. The default is read afresh, and reset on the way out."""
    from patchkit.patches.megatron.mtp import _options

    monkeypatch.setenv(variable, value)
    _options.reset_default()
    try:
        assert getattr(_options.default_options(), field) == expected
        monkeypatch.setenv(variable, "not-a-choice")
        _options.reset_default()
        with pytest.raises(_options.MTPOptionError, match=variable):
            _options.default_options()
    finally:
        _options.reset_default()
