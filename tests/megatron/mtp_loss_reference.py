"""The MTP loss reference case shared by ``make_mtp_loss_fixture.py`` and ``test_mtp_loss_normalisation.py``,
and the recorder of attached MTP losses every MTP test uses.

One set of inputs to ``GPTModel._postprocess`` (decoder + MTP hidden states, output-layer weight,
labels, a loss mask with holes that rolling moves) and a way to record the MTP losses a
``_postprocess`` attaches through ``MTPLossAutoScaler``. The fixture script runs it against an
unpatched megatron-core 0.17+ (``process_mtp_loss``) and stores inputs and attached losses; the
test replays the stored inputs on every release and compares. Tensors travel as base64 of their
little-endian bytes, so the stored values are the exact bits upstream produced.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

FIXTURE = Path(__file__).parent / "fixtures" / "mtp_loss_upstream.json"
HIDDEN_SIZE = 16
SEQ_LEN = 16
BATCH_SIZE = 2
MAX_DEPTHS = 3
#: (mtp_num_layers, calculate_per_token_loss) of every stored case.
CASES = [(depths, per_token) for depths in (1, 2, 3) for per_token in (True, False)]


def encode(tensor: torch.Tensor) -> dict[str, Any]:
    data = tensor.detach().contiguous().cpu()
    return {"dtype": str(data.dtype).removeprefix("torch."), "shape": list(data.shape),
            "data": base64.b64encode(data.numpy().tobytes()).decode("ascii")}


def decode(stored: dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, stored["dtype"])
    raw = bytearray(base64.b64decode(stored["data"]))
    return torch.frombuffer(raw, dtype=dtype).reshape(stored["shape"]).clone()


def make_inputs(vocab_size: int, seed: int = 23) -> dict[str, torch.Tensor]:
    """Hidden states for ``MAX_DEPTHS`` (a case with fewer depths takes the leading chunks)."""
    generator = torch.Generator().manual_seed(seed)
    loss_mask = torch.ones(BATCH_SIZE, SEQ_LEN)
    loss_mask[0, :4] = 0.0  # a prompt
    loss_mask[0, 9] = 0.0  # a hole inside the response
    loss_mask[1, -3:] = 0.0  # padding at the end: rolled-in tokens the count must lose
    return {
        "hidden_states": torch.randn((1 + MAX_DEPTHS) * SEQ_LEN, BATCH_SIZE, HIDDEN_SIZE, generator=generator),
        "output_weight": torch.randn(vocab_size, HIDDEN_SIZE, generator=generator) * 0.2,
        "labels": torch.randint(0, vocab_size, (BATCH_SIZE, SEQ_LEN), generator=generator),
        "loss_mask": loss_mask,
    }


def build_model(mtp_num_layers: int, calculate_per_token_loss: bool, output_weight: torch.Tensor) -> Any:
    from tiny_gpt import build_tiny_gpt

    model = build_tiny_gpt(
        mtp_num_layers=mtp_num_layers, hidden_size=HIDDEN_SIZE, num_attention_heads=2,
        calculate_per_token_loss=calculate_per_token_loss,
    )
    with torch.no_grad():
        model.output_layer.weight.copy_(output_weight)
    return model


@contextmanager
def recording_attached_losses() -> Iterator[list[torch.Tensor]]:
    """Every loss handed to ``MTPLossAutoScaler.apply`` inside the block, in call order."""
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

    recorded: list[torch.Tensor] = []
    original = MTPLossAutoScaler.apply

    def recording_apply(output: torch.Tensor, mtp_loss: torch.Tensor) -> torch.Tensor:
        recorded.append(mtp_loss.detach().clone())
        return original(output, mtp_loss)

    MTPLossAutoScaler.apply = recording_apply
    try:
        yield recorded
    finally:
        MTPLossAutoScaler.apply = original


def attached_losses(model: Any, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Drive ``model._postprocess`` with the MTP hidden states already computed; the losses it attaches."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    depths = model.config.mtp_num_layers
    hidden = inputs["hidden_states"][: (1 + depths) * SEQ_LEN].clone()
    with recording_attached_losses() as recorded:
        model._postprocess(
            hidden_states=hidden, input_ids=inputs["labels"], position_ids=None, labels=inputs["labels"],
            rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None, mtp_in_postprocess=False,
            loss_mask=inputs["loss_mask"],
        )
    MTPLossLoggingHelper.tracker.clear()
    return recorded


def write_fixture(meta: dict[str, str], inputs: dict[str, torch.Tensor],
                  cases: dict[tuple[int, bool], list[torch.Tensor]]) -> None:
    payload = {
        "generated_by": "tests/megatron/make_mtp_loss_fixture.py",
        **meta,
        "inputs": {name: encode(value) for name, value in inputs.items()},
        "cases": [
            {"mtp_num_layers": depths, "calculate_per_token_loss": per_token,
             "attached": [encode(loss) for loss in losses]}
            for (depths, per_token), losses in cases.items()
        ],
    }
    FIXTURE.write_text(json.dumps(payload, indent=1) + "\n")


def read_fixture() -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[tuple[int, bool], list[torch.Tensor]]]:
    payload = json.loads(FIXTURE.read_text())
    inputs = {name: decode(value) for name, value in payload.pop("inputs").items()}
    cases = {
        (case["mtp_num_layers"], case["calculate_per_token_loss"]): [decode(loss) for loss in case["attached"]]
        for case in payload.pop("cases")
    }
    return payload, inputs, cases
