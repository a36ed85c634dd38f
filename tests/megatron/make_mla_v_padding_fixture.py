"""Record megatron-core 0.18+'s own MLA output on packed sequences into ``fixtures/mla_v_padding_upstream.json``.

Run inside an environment with megatron-core 0.18 or later (upstream pads V itself there)::

    .nox/tests-mcore-0-18/bin/python tests/megatron/make_mla_v_padding_fixture.py

The file holds the tiny MLA layer's weights, the packed input and the layer's output.
``test_mla_v_padding.py`` loads the same weights into the same layer on every release: with
``megatron.mla_v_padding`` on 0.14-0.17 (and natively on 0.18+) the output must be 0.18's.
"""

from __future__ import annotations

import json
import logging
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

logger = logging.getLogger("make_mla_v_padding_fixture")

FIXTURE = Path(__file__).parent / "fixtures" / "mla_v_padding_upstream.json"


def _listed(tensor: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(tensor.shape), "values": tensor.flatten().tolist()}


def _tensor(entry: dict[str, Any]) -> torch.Tensor:
    return torch.tensor(entry["values"], dtype=torch.float32).reshape(entry["shape"])


def load_fixture() -> tuple[dict[str, str], dict[str, torch.Tensor], list[int], torch.Tensor, torch.Tensor]:
    """(versions it was made with, weights, sequence lengths, packed input, upstream's output)."""
    payload = json.loads(FIXTURE.read_text())
    weights = {name: _tensor(entry) for name, entry in payload["weights"].items()}
    return (payload["made_with"], weights, payload["lengths"], _tensor(payload["hidden_states"]),
            _tensor(payload["output"]))


def main() -> None:
    from packaging.version import Version

    logging.basicConfig(level=logging.INFO)
    mcore = version("megatron-core")
    if Version(mcore) < Version("0.18"):
        raise SystemExit(f"megatron-core {mcore}: the reference must come from 0.18+, which pads V itself")
    from patchkit.patches.megatron._checks._harness import megatron_on
    from patchkit.patches.megatron.attention._checks._mla_core_attention import (
        SEQUENCE_LENGTHS,
        build_mla,
        packed_forward,
        packed_hidden_states,
    )

    with megatron_on("cpu"), torch.no_grad():
        layer = build_mla()
        hidden_states = packed_hidden_states("cpu")
        output = packed_forward(layer, hidden_states)
    weights = {name: _listed(tensor) for name, tensor in layer.state_dict().items() if isinstance(tensor, torch.Tensor)}
    payload = {"made_with": {"megatron_core": mcore, "torch": version("torch")}, "weights": weights,
               "lengths": list(SEQUENCE_LENGTHS), "hidden_states": _listed(hidden_states), "output": _listed(output)}
    FIXTURE.write_text(json.dumps(payload, indent=1) + "\n")
    logger.info("wrote %s from megatron-core %s (%d weights)", FIXTURE.name, mcore, len(weights))


if __name__ == "__main__":
    main()
