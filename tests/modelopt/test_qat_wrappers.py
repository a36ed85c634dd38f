"""apply_qat as a training engine calls it: DDP-wrapped chunks, verl's names, the caller's objects back."""

from __future__ import annotations

import pytest
import torch
from _multiprocess import rendezvous, spawn_ranks
from modelopt.torch.quantization.nn import TensorQuantizer
from patchkit.patches.modelopt.qat import apply_qat, qat_settings
from qat_fixtures import VERL_IGNORE, batch, ddp_world_worker, fake_quant_weights, wrap_ddp

QKV = "decoder.layers.0.self_attention.linear_qkv"


def _quantizer_state(model) -> dict[str, tuple[bool, object]]:
    return {
        name: (m.is_enabled, None if getattr(m, "_amax", None) is None else m._amax.clone())
        for name, m in model.named_modules() if isinstance(m, TensorQuantizer)
    }


def _assert_same_qat_model(expected, actual) -> None:
    """Same quantizers (names, enabled, amax) and the same fake-quant weights, bit for bit."""
    want, got = _quantizer_state(expected), _quantizer_state(actual)
    assert want.keys() == got.keys()
    for name, (enabled, amax) in want.items():
        assert got[name][0] == enabled, name
        assert (amax is None and got[name][1] is None) or torch.equal(amax, got[name][1]), name
    want_w, got_w = fake_quant_weights(expected), fake_quant_weights(actual)
    assert want_w.keys() == got_w.keys() and len(want_w) == 20
    for name, tensor in want_w.items():
        assert torch.equal(tensor, got_w[name]), name


def test_framework_style_call_on_ddp_chunks_gives_the_same_qat_model(tiny_moe_gpt, cpu_backend):
    bare = tiny_moe_gpt(seed=0)
    apply_qat(bare, "w4a16_nvfp4")
    first, second = tiny_moe_gpt(seed=0), tiny_moe_gpt(seed=1)
    chunks = [wrap_ddp(first), wrap_ddp(second)]
    wrappers = list(chunks)
    returned = apply_qat(chunks, "w4a16", ignore_patterns=VERL_IGNORE)
    assert returned is chunks and all(a is b for a, b in zip(returned, wrappers, strict=True))
    _assert_same_qat_model(bare, first)
    assert set(qat_settings(chunks[1]).quantized) == set(qat_settings(bare).quantized)


def test_verl_per_chunk_assignment_keeps_each_wrapper(tiny_moe_gpt, cpu_backend):
    bare = tiny_moe_gpt(seed=0)
    apply_qat(bare)
    model = tiny_moe_gpt(seed=0)
    modules = [wrap_ddp(model)]
    ddp = modules[0]
    for i in range(len(modules)):
        modules[i] = apply_qat(modules[i], "W4A16_NVFP4_CFG", ignore_patterns=VERL_IGNORE)
    assert modules[0] is ddp and ddp.module is model
    _assert_same_qat_model(bare, model)


def test_forward_backward_through_ddp_after_qat_reaches_ddps_grad_buffers(tiny_moe_gpt, cpu_backend):
    reference = tiny_moe_gpt(mtp_num_layers=None)
    apply_qat(reference)
    reference(**batch()).mean().backward()

    model = tiny_moe_gpt(mtp_num_layers=None)
    ddp = wrap_ddp(model)
    params = [id(p) for p in model.parameters()]
    ddp = apply_qat(ddp)
    # Quantizer state is buffers only: DDP's parameters (and its grad-buffer views) are untouched.
    assert [id(p) for p in model.parameters()] == params
    assert all(not list(m.parameters()) for m in model.modules() if isinstance(m, TensorQuantizer))
    ddp.zero_grad_buffer()
    ddp(**batch()).mean().backward()
    ddp.finish_grad_sync()
    ref = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.main_grad, ref[name].grad, rtol=0, atol=0, msg=name)
    assert model.get_submodule(QKV).weight.main_grad.abs().sum() > 0


def test_float16_module_and_a_framework_wrapper_are_kept(tiny_moe_gpt, cpu_backend):
    from megatron.core.transformer.module import Float16Module

    class EngineWrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    model = tiny_moe_gpt(bf16=True)
    wrapped = EngineWrapper(wrap_ddp(Float16Module(model.config, model)))
    assert apply_qat(wrapped) is wrapped
    assert isinstance(model.get_submodule(QKV).weight_quantizer, TensorQuantizer)
    # Quantizer names start at the bare model's root, where ignore patterns and exporters look.
    assert QKV in qat_settings(wrapped).quantized


def test_a_model_with_a_child_named_module_is_not_taken_for_a_wrapper(cpu_backend):
    model = torch.nn.Module()
    model.module = torch.nn.Linear(32, 32)
    model.head = torch.nn.Linear(32, 32)
    apply_qat(model)
    assert set(qat_settings(model).quantized) == {"module", "head"}


@pytest.mark.parametrize("world_size", [1, 2])
def test_ddp_world_forward_backward_after_qat(world_size, tmp_path):
    spawn_ranks(ddp_world_worker, world_size, (world_size, rendezvous(tmp_path / "rendezvous"), str(tmp_path)),
                timeout=600)
    assert sorted(p.name for p in tmp_path.glob("rank*")) == [f"rank{r}.ok" for r in range(world_size)]
