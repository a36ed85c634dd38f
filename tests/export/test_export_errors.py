"""Bad input: a clear :class:`QATExportError` naming the layer and parameter, before any tensor is yielded."""

from __future__ import annotations

import pytest
import torch
from export_models import build_gpt, qat
from patchkit.patches.modelopt.qat import QATExportError, export_qat_config, export_qat_weights

QKV = "decoder.layers.1.self_attention.linear_qkv"


def test_a_model_without_qat_is_refused(megatron_cpu):
    model = build_gpt(False)
    with pytest.raises(QATExportError, match="no ModelOpt quantizers.*apply_qat"):
        export_qat_weights([model])
    with pytest.raises(QATExportError, match="no ModelOpt quantizers"):
        export_qat_config([model])


def test_an_uncalibrated_weight_quantizer_is_named(megatron_cpu, cpu_backend):
    model = qat(build_gpt(False))
    quantizer = dict(model.named_modules())[QKV].weight_quantizer
    del quantizer._amax
    with pytest.raises(QATExportError, match="never calibrated") as error:
        export_qat_weights([model])
    assert (error.value.layer, error.value.parameter) == (QKV, f"{QKV}.weight")


@pytest.mark.parametrize("value", [0.0, float("nan"), float("inf")])
def test_a_zero_or_non_finite_amax_is_named(megatron_cpu, cpu_backend, value):
    model = qat(build_gpt(False))
    quantizer = dict(model.named_modules())[QKV].weight_quantizer
    quantizer._amax.fill_(value)
    with pytest.raises(QATExportError, match="one finite positive amax") as error:
        export_qat_weights([model])
    assert error.value.parameter == f"{QKV}.weight"


def test_a_non_nvfp4_quantizer_is_named(megatron_cpu, cpu_backend):
    model = qat(build_gpt(False))
    quantizer = dict(model.named_modules())[QKV].weight_quantizer
    quantizer._num_bits = (4, 3)
    with pytest.raises(QATExportError, match="not NVFP4") as error:
        export_qat_weights([model])
    assert error.value.layer == QKV


def test_native_asked_for_without_a_bridge_that_has_it(megatron_cpu, cpu_backend):
    model = qat(build_gpt(False))

    class OldBridge:
        pass

    with pytest.raises(QATExportError, match="export_hf_weights_modelopt"):
        export_qat_weights([model], OldBridge(), native=True)


def test_errors_come_before_the_first_tensor(megatron_cpu, cpu_backend):
    # The checks run when export_qat_weights is called, not lazily at the bad layer: a consumer
    # that has started loading tensors never has to undo half a model.
    model = qat(build_gpt(False))
    last = "decoder.layers.1.mlp.linear_fc2"
    del dict(model.named_modules())[last].weight_quantizer._amax
    with pytest.raises(QATExportError) as error:
        export_qat_weights([model])
    assert error.value.layer == last


def test_wrapped_chunks_are_unwrapped(megatron_cpu, cpu_backend):
    from megatron.core.transformer.module import Float16Module

    model = qat(build_gpt(False, dtype=torch.bfloat16))
    wrapped = Float16Module(model.config, model)
    assert [n for n, _ in export_qat_weights([wrapped])] == [n for n, _ in export_qat_weights(model)]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_weight_is_named_when_the_stream_ends(megatron_cpu, cpu_backend, value):
    """A diverged step: NVFP4 would pack NaN or infinity as the largest code and vLLM serve it.
    The check is read once, after the last tensor (see ``_export_finite``), so every tensor is
    produced and the stream raises instead of ending."""
    model = qat(build_gpt(False))
    clean = [name for name, _ in export_qat_weights([model])]
    linear = dict(model.named_modules())[QKV]
    with torch.no_grad():
        linear.weight[3, 5] = value
    produced = []
    with pytest.raises(QATExportError, match="NaN or infinite") as error:
        for name, _ in export_qat_weights([model]):
            produced.append(name)
    assert produced == clean
    assert (error.value.layer, error.value.parameter) == (QKV, f"{QKV}.weight")


def test_every_non_finite_weight_is_counted_and_the_first_named(megatron_cpu, cpu_backend):
    model = qat(build_gpt(False))
    modules = dict(model.named_modules())
    first, second = "decoder.layers.0.self_attention.linear_qkv", "decoder.layers.1.mlp.linear_fc2"
    with torch.no_grad():
        modules[second].weight.fill_(float("nan"))
        modules[first].weight[0, 0] = float("inf")
    with pytest.raises(QATExportError, match=r"1 more weights") as error:
        list(export_qat_weights([model]))
    assert error.value.parameter == f"{first}.weight"


def _train_one_step(model) -> None:
    """One SGD step through the QAT forward and backward: such a model trains (ModelOpt pads the last block)."""
    from qat_fixtures import batch

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model(**batch()).float().mean().backward()
    optimizer.step()
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


@pytest.mark.parametrize(("overrides", "layer", "columns"), [
    pytest.param({"hidden_size": 72, "num_attention_heads": 4, "num_query_groups": 2},
                 "decoder.layers.0.self_attention.linear_proj", 72, id="hidden-72"),
    pytest.param({"ffn_hidden_size": 136}, "decoder.layers.0.mlp.linear_fc2", 136, id="ffn-136"),
    pytest.param({"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 40},
                 "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2", 40, id="expert-ffn-40"),
])
def test_a_weight_without_whole_nvfp4_blocks_is_named_before_the_first_tensor(
    megatron_cpu, cpu_backend, overrides, layer, columns
):
    """Hidden size 72 trained under QAT, then the export streamed 4 tensors and raised an
    untyped ValueError naming no layer. The shapes are checked when export_qat_weights is called."""
    moe = "num_moe_experts" in overrides
    model = qat(build_gpt(moe, **overrides))
    _train_one_step(model)
    with pytest.raises(QATExportError, match=rf"input dimension of {columns}, not a multiple of the NVFP4 block "
                                             r"size 16") as error:
        export_qat_weights([model])  # raises here: no generator is handed out
    assert (error.value.layer, error.value.parameter) == (layer, f"{layer}.weight")
    assert dict(model.named_modules())[layer].weight.shape[-1] == columns
    with pytest.raises(QATExportError, match="input dimension") as error:
        export_qat_config([model])
    assert error.value.layer == layer


@pytest.mark.parametrize("layout", ["per-expert", "Fused", None, 0])
def test_an_unknown_expert_layout_is_refused(megatron_cpu, cpu_backend, layout):
    model = qat(build_gpt(True))
    with pytest.raises(QATExportError, match="unknown expert_layout.*'per_expert', 'fused'"):
        export_qat_weights([model], expert_layout=layout)


def test_a_fused_expert_layout_needs_hugging_face_names(megatron_cpu, cpu_backend):
    model = qat(build_gpt(True))
    with pytest.raises(QATExportError, match="needs Hugging Face names"):
        export_qat_weights([model], expert_layout="fused")
    names = [name for name, _ in export_qat_weights([model], expert_layout="per_expert")]
    assert names == [name for name, _ in export_qat_weights([model])]
    assert "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight_scale_2" in names
