"""TP=2, EP=2 and PP=2 with real gloo ranks export the same names and tensors as TP=EP=PP=1.

The single-rank export of the same weights is the reference; every rank of the parallel job must
yield exactly its names, in its order, with bit-identical tensors (``dist_worker``). Each layout
runs in fresh processes (``tests/_multiprocess.spawn_ranks``), two ranks on CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from export_models import PARALLEL_LAYOUTS, build_gpt, full_state, qat
from patchkit.patches.modelopt.qat import export_qat_config, export_qat_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _multiprocess import rendezvous, spawn_ranks  # noqa: E402


@pytest.mark.parametrize(("layout", "moe"), list(PARALLEL_LAYOUTS.values()), ids=list(PARALLEL_LAYOUTS))
def test_parallel_export_equals_single_rank_export(megatron_cpu, cpu_backend, tmp_path, layout, moe):
    import dist_worker

    dtype = torch.bfloat16
    model = build_gpt(moe, dtype=dtype, seed=11)
    state = full_state(model)
    model = qat(model)
    exported = list(export_qat_weights([model]))
    reference_config = export_qat_config([model])["hf_quant_config"]["quantization"]
    torch.save({"state": state, "exported": exported}, tmp_path / "reference.pt")

    spawn_ranks(dist_worker.run, 2, (2, rendezvous(tmp_path / "rendezvous"), str(tmp_path), layout, moe, "bfloat16"),
                timeout=600)
    names = [name for name, _ in exported]
    dist_worker.assert_every_rank_matches(str(tmp_path), names, reference_config)
