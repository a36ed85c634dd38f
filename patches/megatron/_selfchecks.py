"""Self-checks of the Megatron-Core patches: each builds upstream's own tiny model and tests the behaviour.

Run by ``patchkit doctor`` (see :mod:`patchkit.selfcheck`) and by the tests in ``tests/megatron``.
On a CPU, Megatron's CUDA-only calls are redirected for the duration of the check
(:mod:`._cpu_stand_in`); on a GPU the model runs there. Megatron's parallel state is started for the
check (one rank) unless the process already has one, and torn down afterwards if the check started it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

from ._tiny_gpt import BATCH_SIZE, SEQ_LEN, VOCAB_SIZE, build_tiny_gpt, make_batch


@contextlib.contextmanager
def megatron_on(device: str) -> Iterator[None]:
    """Megatron parallel state (TP=PP=CP=1) on a one-rank group, on ``device``."""
    from megatron.core import parallel_state

    from ._cpu_stand_in import cpu_megatron, destroy_parallel_state, initialize_parallel_state

    with cpu_megatron() if device == "cpu" else contextlib.nullcontext():
        started = not parallel_state.model_parallel_is_initialized()
        if started:
            if device == "cuda" and not torch.distributed.is_initialized():
                _start_nccl_group()
            initialize_parallel_state()
        try:
            yield
        finally:
            if started:
                destroy_parallel_state()


def _start_nccl_group() -> None:
    import os

    from ._cpu_stand_in import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    torch.cuda.set_device(0)
    torch.distributed.init_process_group(backend="nccl", rank=0, world_size=1)


def _forward(model: Any, batch: Any, labels: bool = True) -> torch.Tensor:
    return model(batch.input_ids, batch.position_ids, batch.attention_mask,
                 labels=batch.labels if labels else None, loss_mask=batch.loss_mask)


def check_mtp_postprocess(context: CheckContext) -> None:
    """Forward with labels returns main-head logits, and the MTP layers still get gradient."""
    with megatron_on(context.device):
        model = build_tiny_gpt(mtp_num_layers=1).to(context.device)
        output = _forward(model, make_batch().to(context.device))
        expected = (BATCH_SIZE, SEQ_LEN, VOCAB_SIZE)
        expect(tuple(output.shape) == expected, "GPTModel.forward(labels=...) returns main-head logits "
               "[batch, seq, vocab] when MTP is on", expected, tuple(output.shape))
        # Zero times the logits: only the MTP loss attached to the output carries gradient.
        (output.float().sum() * 0).backward()
        mtp_grads = {n: p.grad for n, p in model.named_parameters() if n.startswith("mtp.")}
        moved = sorted(n for n, g in mtp_grads.items() if g is not None and bool(g.abs().sum() > 0))
        expect(bool(moved), "the MTP layers get gradient from the attached MTP loss",
               f"nonzero gradient in {len(mtp_grads)} MTP parameters", "none")
        from ._mtp_options import default_options

        if not default_options().derive_labels:  # without_labels="skip", the default
            model.zero_grad(set_to_none=True)
            _forward(model, make_batch().to(context.device), labels=False).float().sum().backward()
            touched = sorted(n for n, p in model.named_parameters() if n.startswith("mtp.") and p.grad is not None)
            expect(not touched, "a forward without labels runs no MTP layer (MTP parameters with gradient)",
                   [], touched)


def check_mtp_detach_inputs(context: CheckContext) -> None:
    """The MTP loss sends no gradient into the embedding: it equals the one without any MTP loss."""
    with megatron_on(context.device):
        batch = make_batch().to(context.device)
        grads = []
        for scale in (0.1, 0.0):  # the same weights, with and without an MTP loss
            model = build_tiny_gpt(mtp_num_layers=1, mtp_loss_scaling_factor=scale).to(context.device)
            output = _forward(model, batch)
            # With the postprocess patch the output is logits; either way only its sum matters.
            output.float().sum().backward()
            grads.append(model.embedding.word_embeddings.weight.grad.detach().clone())
        difference = float((grads[0] - grads[1]).abs().max())
        expect(difference <= 1e-6, "the MTP loss leaves the embedding's gradient unchanged (max difference)",
               "<= 1e-6", f"{difference:.3g}")


def check_swiglu_singleton_local_shards(context: CheckContext) -> None:
    """Native: megatron-core's swiglu sharded-state factory accepts ``singleton_local_shards``."""
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    from patchkit.runtime.probing import accepts_parameter

    expect(accepts_parameter(apply_swiglu_sharded_factory, "singleton_local_shards"),
           "apply_swiglu_sharded_factory takes singleton_local_shards", "the parameter", "no such parameter")


# --- megatron.mtp_recompute ---


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def check_mtp_recompute(context: CheckContext) -> None:
    """With ``recompute_granularity='full'``, an MTP layer takes what RL jobs give it and trains as without.

    Each input the installed release hands its MTP layer is tried: a non-tensor keyword through
    ``_checkpointed_forward(forward_func, ...)`` (0.14-0.17), packed sequences (``packed_seq_params``,
    where the release's MTP layer accepts them: 0.16+), a ``padding_mask`` (0.18+). The recomputed
    layer must run forward and backward and give its parameters the gradients the same layer gives
    without recompute. On 0.19+ (native) this shows upstream doing it.
    """
    from ._mtp_recompute_probe import (
        RECOMPUTE,
        checkpointed_call_grad,
        mtp_layer_grads,
        takes_forward_func,
        takes_padding_mask,
    )

    device = context.device
    with megatron_on(device):
        layer = build_tiny_gpt(mtp_num_layers=1, **RECOMPUTE).mtp.layers[0].to(device)
        if takes_forward_func(layer):
            try:
                grad = checkpointed_call_grad(layer, device)
            except Exception as exc:
                raise SelfCheckFailed("MultiTokenPredictionLayer._checkpointed_forward takes a non-tensor keyword "
                                      "(packed_seq_params)", "a checkpointed forward and backward",
                                      _first_line(exc)) from exc
            expect(bool((grad == 3.0).all()), "the checkpointed function's gradient comes back through "
                   "_checkpointed_forward (d(3x)/dx)", 3.0, f"values in [{float(grad.min()):g}, {float(grad.max()):g}]")
        cases = {"packed sequences (packed_seq_params)": {"packed": True}}
        if takes_padding_mask(layer):
            cases["a padding_mask"] = {"padding_mask": True}
        for what, inputs in cases.items():
            try:
                plain = mtp_layer_grads(build_tiny_gpt(mtp_num_layers=1).to(device), device=device, **inputs)
            except AssertionError as exc:
                if "packing is not yet supported" in str(exc):
                    continue  # 0.14/0.15 refuse packed sequences in the MTP layer, recompute or not
                raise
            try:
                recomputed = mtp_layer_grads(build_tiny_gpt(mtp_num_layers=1, **RECOMPUTE).to(device),
                                             device=device, **inputs)
            except Exception as exc:
                raise SelfCheckFailed(f"a recomputed MTP layer runs forward and backward with {what}",
                                      "gradients for its parameters", _first_line(exc)) from exc
            expect(recomputed.keys() == plain.keys() and bool(plain), f"the recomputed MTP layer with {what} "
                   "gives gradient to the parameters the plain layer does", sorted(plain), sorted(recomputed))
            difference = max(float((recomputed[n] - plain[n]).abs().max()) for n in plain)
            expect(difference <= 1e-5, f"the recomputed MTP layer with {what} gets the plain layer's gradients "
                   "(largest difference)", "<= 1e-5", f"{difference:.3g}")


# --- router replay (megatron.router_replay, megatron.router_replay_validation,
# megatron.moe_alltoall_replay_token_count) ---


@contextlib.contextmanager
def _moe_replay(device: str) -> Iterator[None]:
    """Megatron on ``device`` with the MoE stand-ins on CPU; replay state of other models left as it was.

    The routers a check builds register in upstream's process-wide list; they are removed again, and
    the routers that were there before keep their actions and targets.
    """
    from . import router_replay_api as replay
    from ._cpu_stand_in import cpu_moe

    registry = replay._replay_class().global_router_replay_instances
    before = list(registry)
    with megatron_on(device), cpu_moe() if device == "cpu" else contextlib.nullcontext():
        try:
            yield
        finally:
            registry[:] = before


def _check_routers(model: Any) -> list[Any]:
    from ._tiny_moe import routers

    found = [getattr(r, "router_replay", None) for r in routers(model)]
    expect(all(r is not None for r in found), "every MoE router of a model built after "
           "router_replay_api.enable(config) has replay state", f"{len(found)} routers with replay state",
           f"{sum(r is not None for r in found)}")
    return found


def _drive(model_routers: list[Any], action: str | None, targets: list[torch.Tensor] | None = None) -> None:
    """Set this model's routers only (other models' routers in the process are not touched)."""
    from . import router_replay_api as replay

    upstream = replay._replay_module().RouterReplayAction
    for index, router in enumerate(model_routers):
        if targets is not None:
            router.clear_indices()
            router.set_target_indices(targets[index].long())
        if action is None:
            router.clear_router_replay_action()
        else:
            router.set_router_replay_action(upstream(action))


def check_router_replay(context: CheckContext) -> None:
    """Record, then replay through FP8-padded THD packing: routing equals the record; another target is followed.

    Three packed samples (5, 11, 3 tokens) padded for FP8 to 128 slots. The recorded indices go
    through ``unpack`` (per-sample, padding dropped) and ``pack`` back; the expert bias is shifted so
    that the router alone would choose other experts; the replayed routing map must equal the
    recorded one at every token. Then a target of different experts (each recorded expert + 1) must
    be what the routers route to.
    """
    import types

    from . import router_replay_api as replay
    from ._tiny_moe import NUM_EXPERTS, RoutingCapture, build_tiny_moe, forward_loss, shift_expert_bias, thd_batch

    lengths, seq_len = [5, 11, 3], 12
    layout = replay.thd_layout(lengths, seq_len=seq_len,
                               config=types.SimpleNamespace(fp8="e4m3", tensor_model_parallel_size=1))
    expect(layout.total_tokens == 128, "FP8 padding packs 5+11+3 tokens into 128 slots", 128, layout.total_tokens)
    with _moe_replay(context.device), torch.no_grad():
        model = build_tiny_moe(max_sequence_length=128).to(context.device)
        model_routers = _check_routers(model)
        per_sample_ids = torch.randint(1, 128, (3, seq_len), generator=torch.Generator().manual_seed(1))
        batch = thd_batch(layout, per_sample_ids).to(context.device)
        capture = RoutingCapture(model)
        try:
            _drive(model_routers, "record")
            forward_loss(model, batch)
            recorded_maps = [m.cpu() for m in capture.take()]
            recorded = [r.get_recorded_indices() for r in model_routers]
            expect(all(r is not None for r in recorded), "a RECORD pass stores every layer's top-k indices",
                   f"{len(model_routers)} recorded tensors", f"{sum(r is not None for r in recorded)}")
            per_sample = replay.unpack(torch.stack([r.cpu() for r in recorded], dim=1), layout)
            packed = replay.pack(per_sample, layout)

            valid = torch.zeros(layout.total_tokens, dtype=torch.bool)
            cells = torch.arange(seq_len) < torch.tensor(lengths)[:, None]
            valid[layout.slot_of_cell.view(3, seq_len)[cells]] = True

            shift_expert_bias(model)
            forward_loss(model, batch)  # no action: what the shifted router chooses on its own
            unreplayed = [m.cpu() for m in capture.take()]
            expect(any(not torch.equal(u[valid], r[valid]) for u, r in zip(unreplayed, recorded_maps, strict=True)),
                   "shifting the expert bias changes the routing without replay (else replay is not tested)",
                   "a different routing", "the recorded routing")

            _drive(model_routers, "replay_forward", list(packed.unbind(1)))
            forward_loss(model, batch)
            replayed = [m.cpu() for m in capture.take()]
            mismatched = sum(int((rep[valid] != rec[valid]).any(-1).sum())
                             for rep, rec in zip(replayed, recorded_maps, strict=True))
            expect(mismatched == 0, "REPLAY_FORWARD of the packed record routes every token as recorded "
                   "(tokens routed differently)", 0, mismatched)

            other = [(t + 1) % NUM_EXPERTS for t in packed.unbind(1)]
            _drive(model_routers, "replay_forward", other)
            forward_loss(model, batch)
            followed = [m.cpu() for m in capture.take()]
            wanted = [torch.zeros_like(m).scatter_(1, t.long(), True) for m, t in zip(followed, other, strict=True)]
            off = sum(int((f[valid] != w[valid]).any(-1).sum()) for f, w in zip(followed, wanted, strict=True))
            expect(off == 0, "REPLAY_FORWARD of a different target routes to the target's experts "
                   "(tokens routed elsewhere)", 0, off)
        finally:
            capture.remove()
            _drive(model_routers, None)


def check_mtp_router_slots(context: CheckContext) -> None:
    """MTP routers log after the decoder's layers; forced tracker entries and replay numbers agree.

    A 2-layer MoE GPT with 2 MoE MTP depths: one training step must leave every router's
    load-balancing and z-loss in its own slot (decoder 1-2, MTP 3-4, none empty); a forced tracker
    entry must be sized 4 like the routers' own; where the replay state carries a ``layer_number``
    (0.19+), the MTP routers' must be 3 and 4.
    """
    from ._mtp_router_probe import AUX_LOSS_CONFIG, forced_entry_sizes, logged_layer_losses, replay_layer_numbers
    from ._tiny_moe import build_tiny_moe, causal_batch

    with _moe_replay(context.device):
        model = build_tiny_moe(mtp_num_layers=2, mtp_loss_scaling_factor=0.1, **AUX_LOSS_CONFIG).to(context.device)
        for name, values in logged_layer_losses(model, causal_batch().to(context.device)).items():
            empty = [slot + 1 for slot, value in enumerate(values.tolist()) if value == 0.0]
            expect(len(values) == 4 and not empty, f"every router logs its {name} in its own slot "
                   "(decoder 1-2, MTP 3-4): empty slots", [], empty if len(values) == 4 else f"{len(values)} slots")
        sizes = forced_entry_sizes(num_layers=2, mtp_num_layers=2)
        expect(set(sizes.values()) == {4}, "track_moe_metrics(force_initialize=True) sizes entries for the "
               "decoder and the MTP layers", 4, sizes)
        numbers = {name: number for name, number in replay_layer_numbers(model).items() if name.startswith("mtp.")}
        if numbers:
            expect(sorted(numbers.values()) == [3, 4], "the MTP routers' replay states are numbered after "
                   "the decoder's layers", [3, 4], sorted(numbers.values()))


def check_router_replay_validation(context: CheckContext) -> None:
    """A replay target with the wrong token count raises ``ReplayIndexMismatchError`` naming both counts."""
    from ._tiny_moe import TOPK, build_tiny_moe, causal_batch, forward_loss
    from .router_replay_api import ReplayIndexMismatchError

    batch = causal_batch().to(context.device)
    tokens = batch.input_ids.numel()
    with _moe_replay(context.device), torch.no_grad():
        model = build_tiny_moe().to(context.device)
        model_routers = _check_routers(model)
        # Padded for another layout: 16 rows too many (what a target packed with FP8 padding
        # for an unpadded input looks like).
        wrong = torch.zeros(tokens + 16, TOPK, dtype=torch.long)
        wrong[:, 1] = 1
        _drive(model_routers, "replay_forward", [wrong.to(context.device)] * len(model_routers))
        try:
            forward_loss(model, batch)
        except ReplayIndexMismatchError as exc:
            expect(exc.expected_tokens == tokens and exc.got_tokens == tokens + 16,
                   "ReplayIndexMismatchError names the router's and the target's token counts",
                   f"{tokens} and {tokens + 16}", f"{exc.expected_tokens} and {exc.got_tokens}")
        except Exception as exc:  # upstream's own failure deep in gather, or anything else
            raise SelfCheckFailed("a replay target with the wrong token count raises", "ReplayIndexMismatchError",
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from exc
        else:
            raise SelfCheckFailed("a replay target with the wrong token count raises", "ReplayIndexMismatchError",
                                  "no error: the forward ran")
        finally:
            _drive(model_routers, None)


def check_moe_alltoall_replay_token_count(context: CheckContext) -> None:
    """Replayed indices naming one expert twice: the all-to-all dispatcher counts the rows really routed."""
    from ._tiny_moe import TOPK, build_tiny_moe, causal_batch, dispatchers, forward_loss

    batch = causal_batch().to(context.device)
    tokens = batch.input_ids.numel()
    with _moe_replay(context.device), torch.no_grad():
        model = build_tiny_moe().to(context.device)
        model_routers = _check_routers(model)
        duplicate = torch.zeros(tokens, TOPK, dtype=torch.long, device=context.device)  # expert 0, topk times
        _drive(model_routers, "replay_forward", [duplicate] * len(model_routers))
        try:
            loss = forward_loss(model, batch)
        except RuntimeError as exc:
            raise SelfCheckFailed("a replay that repeats an expert passes through the all-to-all dispatcher",
                                  f"a forward routing {tokens} rows per layer",
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from exc
        finally:
            _drive(model_routers, None)
        counts = [int(d.num_out_tokens) for d in dispatchers(model)]
        expect(counts == [tokens] * len(counts), "the all-to-all dispatcher's num_out_tokens under a replay "
               "that repeats an expert is the rows the routing map holds", [tokens] * len(counts), counts)
        expect(bool(torch.isfinite(loss).all()), "the replayed forward's loss is finite", "finite", "non-finite")


# --- megatron.tms_hook_mode ---


def _tms_outcome(module_name: str, code: Any, saver: Any) -> str:
    from ._tms_hook_mode_probe import pending_hook_mode, run_statement

    try:
        run_statement(module_name, code, saver)
    except Exception as exc:
        return _first_line(exc)
    return str(pending_hook_mode(saver))


def check_tms_hook_mode(context: CheckContext) -> None:
    """megatron-core's import-time ``hook_mode`` statements, run from the installed files, keep the
    process's torch_memory_saver mode: a mode set before stays, LD_PRELOAD's preload stays, an
    initialised saver is left alone (no error); with nothing chosen, megatron's ``"torch"`` applies.
    On a release that has no such statement (native, before 0.16) there is nothing to keep."""
    from ._tms_hook_mode_probe import fresh_saver, hook_mode_statements, ld_preload

    statements = {name: codes for name, codes in hook_mode_statements().items() if codes}
    if not statements:
        return  # nothing in this release sets the hook mode at import
    for module_name, codes in statements.items():
        for code in codes:
            with ld_preload(False):
                kept = _tms_outcome(module_name, code, _preset(fresh_saver(), "preload"))
                expect(kept == "preload", f"importing {module_name} keeps a hook mode set before it",
                       "preload", kept)
                initialised = _tms_outcome(module_name, code, fresh_saver(initialised_as="preload"))
                expect(initialised == "None", f"importing {module_name} after torch_memory_saver was "
                       "initialised leaves the saver alone", "no error, nothing pending", initialised)
                chosen_by_megatron = _tms_outcome(module_name, code, fresh_saver())
                expect(chosen_by_megatron == "torch", f"importing {module_name} with no mode chosen "
                       "sets megatron's own", "torch", chosen_by_megatron)
            with ld_preload(True):
                preload = _tms_outcome(module_name, code, fresh_saver())
                expect(preload == "None", f"importing {module_name} under LD_PRELOAD of torch_memory_saver's "
                       "preload library keeps the preload default", "None (preload default)", preload)


def _preset(saver: Any, mode: str) -> Any:
    saver.hook_mode = mode
    return saver


# --- megatron.routing_replay_keyword ---

_MOE_CONFIG = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8, moe_router_topk=2,
                   use_cpu_initialization=True, add_bias_linear=False)


def check_routing_replay_keyword(context: CheckContext) -> None:
    """``TransformerConfig(enable_routing_replay=True)`` builds, sets ``moe_enable_routing_replay``, shows
    the keyword in the signature, keeps upstream's dataclass fields, and refuses a contradicting pair."""
    import dataclasses
    import inspect

    from megatron.core.transformer.transformer_config import TransformerConfig

    from ._routing_replay_keyword_alias import RoutingReplayKeywordConflict

    try:
        config = TransformerConfig(**_MOE_CONFIG, enable_routing_replay=True)
    except TypeError as exc:
        raise SelfCheckFailed("TransformerConfig accepts enable_routing_replay=True", "a config",
                              _first_line(exc)) from exc
    expect(getattr(config, "moe_enable_routing_replay", None) is True,
           "enable_routing_replay=True sets moe_enable_routing_replay", True,
           getattr(config, "moe_enable_routing_replay", "no such attribute"))
    expect(getattr(config, "enable_routing_replay", None) is True, "config.enable_routing_replay reads the switch",
           True, getattr(config, "enable_routing_replay", "no such attribute"))
    expect("enable_routing_replay" in inspect.signature(TransformerConfig.__init__).parameters,
           "TransformerConfig.__init__'s signature names enable_routing_replay", "the parameter", "none")
    names = [f.name for f in dataclasses.fields(TransformerConfig)]
    expect("enable_routing_replay" not in names, "upstream's dataclass fields are unchanged (no new field)",
           "no enable_routing_replay field", "a field")
    try:
        TransformerConfig(**_MOE_CONFIG, enable_routing_replay=True, moe_enable_routing_replay=False)
    except RoutingReplayKeywordConflict:
        pass
    except Exception as exc:
        raise SelfCheckFailed("enable_routing_replay=True with moe_enable_routing_replay=False raises",
                              "RoutingReplayKeywordConflict", _first_line(exc)) from exc
    else:
        raise SelfCheckFailed("enable_routing_replay=True with moe_enable_routing_replay=False raises",
                              "RoutingReplayKeywordConflict", "a config")


# --- megatron.output_processor ---


def check_output_processor(context: CheckContext) -> None:
    """``forward(output_processor=...)`` on a tiny GPT: the processor gets the hidden states and the
    output weight, the output layer never runs (no full logits), and its chunked log-probs equal those
    from upstream's full logits."""
    from ._output_processor_probe import (
        LogProbContext,
        OutputLayerCalls,
        build_gpt,
        chunked_label_log_probs,
        label_log_probs_from_logits,
    )

    with megatron_on(context.device), torch.no_grad():
        model = build_gpt(True, SEQ_LEN, VOCAB_SIZE).to(context.device)
        batch = make_batch().to(context.device)
        expected = label_log_probs_from_logits(_forward(model, batch, labels=False), batch.labels)
        seen = LogProbContext(chunk=4)
        calls = OutputLayerCalls(model)
        try:
            result = model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels,
                           output_processor=chunked_label_log_probs, output_processor_context=seen)
        except TypeError as exc:
            raise SelfCheckFailed("GPTModel.forward takes output_processor and output_processor_context",
                                  "the processor's result", _first_line(exc)) from exc
        finally:
            calls.remove()
        expect(calls.count == 0, "with an output_processor the output layer never runs (no full logits)",
               0, calls.count)
        hidden = seen.received.get("hidden_states")
        shape = None if hidden is None else tuple(hidden.shape)
        expect(shape == (SEQ_LEN, BATCH_SIZE, 64), "the processor receives the decoder's hidden states "
               "[seq, batch, hidden]", (SEQ_LEN, BATCH_SIZE, 64), shape)
        expect(seen.received.get("output_weight") is model.shared_embedding_or_output_weight(),
               "the processor receives the tied output weight", "the shared embedding weight",
               type(seen.received.get("output_weight")).__name__)
        shape = tuple(getattr(result, "shape", ()))
        expect(shape == (BATCH_SIZE, SEQ_LEN), "forward returns the processor's result", (BATCH_SIZE, SEQ_LEN), shape)
        difference = float((result - expected).abs().max())
        expect(difference <= 1e-5, "chunked log-probs equal those from the full logits (max difference)",
               "<= 1e-5", f"{difference:.3g}")


# --- megatron.moe_recompute_release ---


def check_moe_recompute_release(context: CheckContext) -> None:
    """After a step with ``recompute_granularity='full'`` nothing of the recomputed forward stays reachable.

    A tiny MoE GPT, each dispatcher the release runs on CPU (all-to-all, all-gather): after forward
    and backward no tensor with autograd history may be reachable from the model (upstream keeps
    the dispatcher's probs, and through them each checkpoint's input and its gradient), and the
    model may hold no more bytes than the same model trained without recompute.
    """
    from ._cpu_stand_in import cpu_moe
    from ._moe_recompute_probe import build_moe_gpt, train_step

    device = context.device
    with megatron_on(device), cpu_moe() if device == "cpu" else contextlib.nullcontext():
        for dispatcher in ("alltoall", "allgather"):
            recomputed = train_step(build_moe_gpt(dispatcher, recompute=True).to(device), device).held
            expect(not recomputed.with_history, f"after backward with full recompute ({dispatcher} dispatcher) "
                   "no tensor with autograd history is reachable from the model (holders)", [],
                   recomputed.holders())
            plain = train_step(build_moe_gpt(dispatcher, recompute=False).to(device), device).held
            expect(recomputed.bytes <= plain.bytes, f"with full recompute ({dispatcher} dispatcher) the model "
                   "holds no more after backward than without recompute (bytes)", f"<= {plain.bytes}",
                   recomputed.bytes)


# --- megatron.tp_group_if_none_helper ---


def check_tp_group_if_none_helper(context: CheckContext) -> None:
    """Native: ``megatron.core.utils.get_tensor_model_parallel_group_if_none`` exists and, with Megatron's
    parallel state started, gives the tensor-parallel group for ``None`` (the expert one with
    ``is_expert=True``) and a given group back unchanged."""
    import warnings

    from megatron.core import parallel_state, utils

    helper = getattr(utils, "get_tensor_model_parallel_group_if_none", None)
    expect(callable(helper), "megatron.core.utils has get_tensor_model_parallel_group_if_none",
           "a function", type(helper).__name__)
    assert helper is not None
    with megatron_on(context.device), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # upstream's "passing tp_group will be mandatory"
        default = parallel_state.get_tensor_model_parallel_group()
        expert = parallel_state.get_expert_tensor_parallel_group()
        expect(helper(None) is default, "for None it gives the tensor-parallel group", default, helper(None))
        expect(helper(None, is_expert=True) is expert, "for None with is_expert=True it gives the expert "
               "tensor-parallel group", expert, helper(None, is_expert=True))
        given = object()
        expect(helper(given) is given, "a group given is returned unchanged", given, helper(given))
