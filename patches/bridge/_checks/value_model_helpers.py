"""Self-check of ``bridge.value_model_helpers``: Bridge's ``train_utils`` turns a tiny MoE GPT into a value
model (one float32 value per token from the head ``make_value_model``'s hook puts in), ``freeze_moe_router``
freezes its routers and nothing else, and ``AutoMapping`` exports the head's weight whole.

The helpers below are shared with the patch's tests, so a check and its tests drive the same model.
"""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect

#: The names Bridge 0.5 added to ``megatron.bridge.training.utils.train_utils``.
HELPER_NAMES = ("LinearForLastLayer", "create_value_head_hook", "make_value_model", "freeze_moe_router")
HIDDEN_SIZE = 64
NUM_EXPERTS = 4


def train_utils() -> Any:
    """Bridge's ``train_utils`` module (the patch's target)."""
    from megatron.bridge.training.utils import train_utils as module

    return module


def missing_helpers() -> list[str]:
    """The names of :data:`HELPER_NAMES` that ``train_utils`` lacks."""
    module = train_utils()
    return [name for name in HELPER_NAMES if not hasattr(module, name)]


def build_tiny_moe_gpt(seed: int = 0) -> Any:
    """A 2-layer, hidden-64 ``GPTModel`` whose MLPs are 4-expert top-2 MoE layers (local specs, CPU)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from ...megatron._checks._tiny_gpt import SEQ_LEN, TINY_TRANSFORMER, VOCAB_SIZE

    config = TransformerConfig(**dict(TINY_TRANSFORMER, ffn_hidden_size=128, add_bias_linear=False,
                                      num_moe_experts=NUM_EXPERTS, moe_router_topk=2))
    torch.manual_seed(seed)
    return GPTModel(config, get_gpt_layer_local_spec(num_experts=NUM_EXPERTS, moe_grouped_gemm=False),
                    vocab_size=VOCAB_SIZE, max_sequence_length=SEQ_LEN)


def values_of(model: Any) -> torch.Tensor:
    """The model's output on the tiny batch, without labels (a value model's forward)."""
    from ...megatron._checks._harness import forward
    from ...megatron._checks._tiny_gpt import make_batch

    return forward(model, make_batch(), labels=False)


def exported_head(module: Any) -> dict[str, torch.Tensor]:
    """The value head's weight exported as ``AutoMapping`` exports it (``score.weight``, the HF name of
    a sequence-classification head), on this rank."""
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    mapping = AutoMapping("output_layer.weight", "score.weight")
    return mapping.megatron_to_hf(module.weight.detach(), module)


def check_value_model_helpers(context: CheckContext) -> None:
    """``train_utils``'s value-model helpers turn a tiny MoE GPT into a value model Bridge can export."""
    from patchkit.patches.megatron._checks._cpu_stand_in import cpu_moe
    from patchkit.patches.megatron._checks._harness import megatron_on

    missing = missing_helpers()
    expect(not missing, "megatron.bridge.training.utils.train_utils", f"the names {list(HELPER_NAMES)}",
           f"{missing} missing")
    module = train_utils()
    with megatron_on("cpu"), cpu_moe():
        model = build_tiny_moe_gpt()
        chunks = module.make_value_model(HIDDEN_SIZE, False)(model)
        head = model.output_layer
        expect(isinstance(head, module.LinearForLastLayer) and chunks == [model],
               "make_value_model's hook on a one-stage model", "the model's output layer a LinearForLastLayer, "
               "the chunk list returned", f"{type(head).__name__}, returned {type(chunks).__name__}")
        values = values_of(model)
        frozen = {name for name, parameter in module.freeze_moe_router(model)[0].named_parameters()
                  if not parameter.requires_grad}
        exported = exported_head(head)
    expect(values.shape[-1] == 1 and values.dtype == torch.float32, "the value model's output",
           "one float32 value per token", f"{tuple(values.shape)} {values.dtype}")
    routers = {f"decoder.layers.{index}.mlp.router.weight" for index in range(2)}
    expect(frozen == routers, "parameters freeze_moe_router froze", sorted(routers), sorted(frozen))
    expect(list(exported) == ["score.weight"] and torch.equal(exported["score.weight"], head.weight.detach()),
           "AutoMapping's export of the value head", "its weight whole under score.weight",
           {name: tuple(tensor.shape) for name, tensor in exported.items()})
