"""Self-check of ``modelopt.vllm_plugin_class_keys``: ModelOpt's registry, with its vLLM plugin imported, answers
lookups and quantizes a model (the patch on ModelOpt 0.44-0.45 with vLLM 0.24-0.26; ModelOpt's own from 0.46)."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ._vllm_registry import registry_state


def check_vllm_plugin_class_keys(context: CheckContext) -> None:
    """No key that is not a class; lookups and ``mtq.quantize`` answer; vLLM's linears stay registered."""
    state = registry_state()
    expect(state["plugin"], "ModelOpt's vLLM plugin imported", True, state["plugin"])
    expect(not state["non_class_keys"], "keys of QuantModuleRegistry that are not classes", "none",
           state["non_class_keys"])
    expect(state["unregistered"] is False, "torch.nn.ReLU in QuantModuleRegistry", False, state["unregistered"])
    expect(state["quantize"] == "quantized", "mtq.quantize of a Linear + ReLU model", "quantized", state["quantize"])
    expect(state["row_parallel"] is True, "vLLM's RowParallelLinear in QuantModuleRegistry", True,
           state["row_parallel"])
