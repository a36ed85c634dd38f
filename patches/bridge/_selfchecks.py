"""Self-checks of the Megatron-Bridge patches: Bridge's own export names and mapping facts on the installed Bridge.

Run by ``patchkit doctor`` (see :mod:`patchkit.selfcheck`) and by ``tests/bridge``. Each check calls the
Bridge function the patch changes (or, where the patch is native, the one that does the job upstream)
on a tiny Megatron model or on parameter names, and compares what comes back with what a ModelOpt QAT
export needs. Megatron runs on one rank (``patchkit.patches.megatron._selfchecks.megatron_on``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

# --- shared pieces ---

#: Each linear of the tiny GPT and the tensor parallelism its weight is split with.
EXPECTED_PARALLELISM = {
    "decoder.layers.0.self_attention.linear_qkv": "column",
    "decoder.layers.0.self_attention.linear_proj": "row",
    "decoder.layers.0.mlp.linear_fc1": "column",
    "decoder.layers.0.mlp.linear_fc2": "row",
    "output_layer": "column",
}


@contextlib.contextmanager
def _tiny_quantizable_gpt(device: str) -> Iterator[Any]:
    """The shared tiny GPT (no MTP) with ModelOpt's quantized classes swapped in for its linears.

    ``QuantModuleRegistry.convert`` is what ``mtq.quantize`` does to each module it quantizes (the
    class becomes ModelOpt's dynamic ``Quant<name>`` subclass, with weight/input quantizers); no
    calibration runs, so no NVFP4 kernel is needed. Each weight quantizer is given an amax, as
    calibration would, so the model holds the ``*_quantizer._amax`` buffers an export meets.
    """
    from modelopt.torch.quantization.nn import QuantModuleRegistry
    from patchkit.patches.megatron._checks._harness import megatron_on
    from patchkit.patches.megatron._checks._tiny_gpt import build_tiny_gpt

    with megatron_on(device):
        model = build_tiny_gpt(mtp_num_layers=None).to(device)
        for name in EXPECTED_PARALLELISM:
            module = model.get_submodule(name)
            QuantModuleRegistry.convert(module)
            module.weight_quantizer.amax = module.weight.detach().abs().amax()
        yield model


# --- bridge.quant_linear_parallelism ---


def check_quant_linear_parallelism(context: CheckContext) -> None:
    """``AutoMapping`` detects the tensor parallelism of ModelOpt's quantized Megatron linears."""
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    with _tiny_quantizable_gpt(context.device) as model:
        found = {}
        for name in EXPECTED_PARALLELISM:
            module = model.get_submodule(name)
            expect(type(module).__name__.startswith("Quant"), f"ModelOpt's conversion renames {name}'s class",
                   "Quant<class>", type(module).__name__)
            try:
                found[name] = AutoMapping(f"{name}.weight", "hf.weight")._detect_parallelism_type(module)
            except ValueError as exc:
                found[name] = f"ValueError: {str(exc).splitlines()[0][:120]}"
    wrong = {name: found[name] for name in EXPECTED_PARALLELISM if found[name] != EXPECTED_PARALLELISM[name]}
    expect(not wrong, "AutoMapping._detect_parallelism_type of each ModelOpt-quantized linear",
           {name: EXPECTED_PARALLELISM[name] for name in wrong}, wrong)


# --- bridge.skip_quantizer_params ---


def exported_names(model: Any) -> list[str]:
    """The global Megatron names a Bridge export walks (``_megatron_global_param_names_all_pp_ranks``)."""
    from megatron.bridge.models.qwen.qwen3_bridge import Qwen3Bridge

    names: list[str] = Qwen3Bridge()._megatron_global_param_names_all_pp_ranks([model])
    return names


def check_skip_quantizer_params(context: CheckContext) -> None:
    """A Bridge export of a quantized model walks its weights and none of its quantizer state."""
    with _tiny_quantizable_gpt(context.device) as model:
        expect(any(name.endswith("weight_quantizer._amax") for name, _ in model.named_buffers()),
               "the quantized model holds quantizer state (else nothing is tested)", "*_quantizer._amax buffers",
               "none")
        names = exported_names(model)
    quantizer_state = [name for name in names if "_quantizer" in name]
    expect(not quantizer_state, "the exported names leave ModelOpt quantizer state out", "no *_quantizer.* names",
           f"{len(quantizer_state)}, e.g. {quantizer_state[:2]}")
    weights = [f"{name}.weight" for name in EXPECTED_PARALLELISM]
    missing = [name for name in weights if name not in names]
    expect(not missing, "the exported names still hold every quantized linear's weight", weights,
           f"missing {missing}")


# --- bridge.expert_local_to_global ---

NUM_EXPERTS = 8
EP_SIZE, EP_RANK = 4, 3


class _ExpertGroup:
    """An expert-parallel group as seen from one rank: all Bridge's renumbering reads of it."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@contextlib.contextmanager
def _on_expert_rank(size: int, rank: int) -> Iterator[None]:
    """Bridge's and megatron-core's EP-group lookups answer ``rank`` of ``size`` (one process stands in).

    Renumbering is arithmetic on the group's size and rank; running ``size`` processes would test the
    same arithmetic at many times the cost (tests/bridge does that once, with four gloo ranks).
    """
    from megatron.bridge.models.conversion import model_bridge
    from megatron.core import parallel_state

    group = _ExpertGroup(size, rank)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(parallel_state, "get_expert_model_parallel_group",
                                              lambda *a, **k: group))
        for name, value in (("get_expert_model_parallel_world_size", size), ("get_expert_model_parallel_rank", rank)):
            stack.enter_context(mock.patch.object(parallel_state, name, lambda *a, _v=value, **k: _v))
        if hasattr(model_bridge, "_get_ep_group"):  # 0.4.2+: the group comes from the model
            stack.enter_context(mock.patch.object(model_bridge, "_get_ep_group", lambda *a, **k: group))
        yield


def check_expert_local_to_global(context: CheckContext) -> None:
    """On EP rank 3 of 4 (8 experts), local expert 1 is exported as global expert 7 in both namings."""
    import types

    from megatron.bridge.models.conversion import model_bridge
    from patchkit.patches.megatron._checks._harness import megatron_on

    config = types.SimpleNamespace(num_moe_experts=NUM_EXPERTS)
    per_rank = NUM_EXPERTS // EP_SIZE
    names = {
        "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight":
            f"decoder.layers.0.mlp.experts.local_experts.{per_rank * EP_RANK + 1}.linear_fc1.weight",
        "decoder.layers.0.mlp.experts.linear_fc1.weight1":
            f"decoder.layers.0.mlp.experts.linear_fc1.weight{per_rank * EP_RANK + 1}",
        "decoder.layers.0.self_attention.linear_qkv.weight": "decoder.layers.0.self_attention.linear_qkv.weight",
    }
    with megatron_on(context.device), _on_expert_rank(EP_SIZE, EP_RANK):
        found = {local: model_bridge._megatron_local_name_to_global([], config, local) for local in names}
    wrong = {local: found[local] for local in names if found[local] != names[local]}
    expect(not wrong, f"_megatron_local_name_to_global on EP rank {EP_RANK} of {EP_SIZE} ({NUM_EXPERTS} experts)",
           {local: names[local] for local in wrong}, wrong)


# --- bridge.expert_sort_key ---

MIXED_NAMES = (
    "decoder.layers.0.mlp.experts.local_experts.10.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight11",
    "decoder.layers.0.mlp.experts.linear_fc1.weight3",
    "decoder.layers.1.self_attention.linear_qkv.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "embedding.word_embeddings.weight",
)
#: Layers in order, experts numerically within a layer, whichever naming.
SORTED_NAMES = [
    "embedding.word_embeddings.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight3",
    "decoder.layers.0.mlp.experts.local_experts.10.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight11",
    "decoder.layers.1.self_attention.linear_qkv.weight",
]


def check_expert_sort_key(context: CheckContext) -> None:
    """The export's sort key orders experts numerically in both namings (local_experts.N and weightN)."""
    from megatron.bridge.models.conversion import model_bridge

    found = sorted(MIXED_NAMES, key=model_bridge.extract_sort_key)
    expect(found == SORTED_NAMES, "sorted(names, key=model_bridge.extract_sort_key)", SORTED_NAMES, found)


# --- bridge.modelopt_layer_spec ---

_NVTE = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


@contextlib.contextmanager
def _attention_environment() -> Iterator[None]:
    """``TransformerConfig.__post_init__`` writes NVTE_*_ATTN for its attention backend and asserts them
    when the next config is finalized: start without them and put back what was there."""
    saved = {name: os.environ.pop(name, None) for name in _NVTE}
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def tiny_provider(**overrides: Any) -> Any:
    """A ``GPTModelProvider`` for a 2-layer hidden-64 GPT on local attention, restoring ModelOpt state."""
    from megatron.bridge.models import gpt_provider
    from megatron.core.transformer.enums import AttnBackend

    kwargs: dict[str, Any] = dict(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, vocab_size=128, seq_length=16,
        use_cpu_initialization=True, restore_modelopt_state=True, attention_backend=AttnBackend.local,
        gradient_accumulation_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        params_dtype=torch.float32, bf16=False,
    )
    kwargs.update(overrides)
    provider = gpt_provider.GPTModelProvider(**kwargs)
    if hasattr(provider, "finalize"):
        provider.finalize()
    if hasattr(provider, "_pg_collection"):
        from megatron.core.process_groups_config import ProcessGroupCollection

        provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    return provider


def provided_layer_norm(provider: Any) -> Any:
    """The input-layernorm class of the layer spec ``provide()`` hands ``GPTModel``; the error if it fails first.

    ``GPTModel`` is spied on (``mock`` wrapping the real class). ModelOpt's spec uses TransformerEngine's
    norm, which cannot be built without TE, so building may stop after the spec was handed over.
    """
    from megatron.bridge.models import gpt_provider

    spy = mock.MagicMock(wraps=gpt_provider.MCoreGPTModel)
    with mock.patch.object(gpt_provider, "MCoreGPTModel", spy):
        try:
            provider.provide()
        except Exception as exc:  # noqa: BLE001 - what matters is whether the spec reached GPTModel
            if not spy.called:
                return exc
    spec = spy.call_args.kwargs["transformer_layer_spec"]
    layer = spec.layer_specs[0] if hasattr(spec, "layer_specs") else spec  # a block spec on some releases
    norm = layer.submodules.input_layernorm
    return getattr(norm, "module", norm)  # a ModuleSpec or the class itself


def check_modelopt_layer_spec(context: CheckContext) -> None:
    """A provider with ``restore_modelopt_state=True`` builds ModelOpt's quantizable layer spec."""
    from megatron.core.post_training.modelopt.layers import Norm as ModelOptNorm
    from patchkit.patches.megatron._checks._harness import megatron_on

    with megatron_on(context.device), _attention_environment():
        found = provided_layer_norm(tiny_provider())
    if isinstance(found, BaseException):
        raise SelfCheckFailed("GPTModelProvider(restore_modelopt_state=True).provide() hands GPTModel a layer spec",
                              "ModelOpt's spec", f"{type(found).__name__} before GPTModel: "
                              f"{str(found).splitlines()[0][:160] if str(found) else ''}") from found
    expect(found is ModelOptNorm, "GPTModelProvider(restore_modelopt_state=True) builds ModelOpt's layer spec "
           "(its input layernorm)", f"{ModelOptNorm.__module__}.Norm", f"{found.__module__}.{found.__qualname__}")


# --- bridge.signal_handler_main_thread ---


def enter_off_the_main_thread(sig: int = signal.SIGTERM) -> dict[str, Any]:
    """Enter and release Bridge's ``DistributedSignalHandler`` in a fresh thread, as a trainer in a
    Ray worker thread does; what happened: ``error`` (None or the exception), ``received`` (its
    ``signals_received()``), ``released`` (``release()``'s answer) and the process's handler for
    ``sig`` before and after."""
    from megatron.bridge.training.utils.sig_utils import DistributedSignalHandler

    outcome: dict[str, Any] = {"error": None, "before": signal.getsignal(sig)}

    def enter_and_release() -> None:
        try:
            with DistributedSignalHandler(sig) as handler:
                outcome["during"] = signal.getsignal(sig)
                outcome["received"] = handler.signals_received()
            outcome["released"] = handler.released
        except BaseException as exc:  # the thread's error is the finding
            outcome["error"] = exc

    worker = threading.Thread(target=enter_and_release, name="patchkit-signal-check")
    worker.start()
    worker.join()
    outcome["after"] = signal.getsignal(sig)
    return outcome


def check_signal_handler_main_thread(context: CheckContext) -> None:
    """``DistributedSignalHandler`` enters and releases in a worker thread and leaves the process's handler alone."""
    outcome = enter_off_the_main_thread()
    error = outcome["error"]
    expect(error is None, "DistributedSignalHandler entered in a worker thread", "no error",
           f"{type(error).__name__}: {error}" if error is not None else None)
    expect(outcome["received"] == [False] and outcome["released"] is True,
           "its signals_received() and release() in that thread", "[False], released",
           f"{outcome['received']}, released={outcome['released']}")
    expect(outcome["before"] is outcome["during"] is outcome["after"],
           "the process's SIGTERM handler while and after it was entered off the main thread", "unchanged",
           f"{outcome['before']!r} -> {outcome['during']!r} -> {outcome['after']!r}")
