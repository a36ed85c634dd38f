"""On two GPUs through NCCL: TP=2, EP=2 and PP=2 export the same names and tensors as one GPU.

The GPU twin of ``test_export_distributed.py`` (which runs the same layouts on gloo ranks with the CPU
fake-quant backend): here nothing is stood in. The reference is the export of a one-GPU model
(``cuda:0``, ModelOpt's CUDA kernel); each rank of the two-GPU job (``dist_worker.run`` with
``device="cuda"``, one GPU a rank, spawned) loads its shard of the same weights, applies QAT with
the same kernel and exports, and must yield exactly the reference's names, in its order, bit for bit
(packed weights, FP8 block scales, ``weight_scale_2`` reduced over the ranks that hold a shard).

Marked ``gpu``; skipped without two CUDA GPUs.
"""

from __future__ import annotations

import pytest
import torch
from _multiprocess import rendezvous, spawn_ranks
from export_models import PARALLEL_LAYOUTS, build_gpt, full_state, qat
from patchkit.patches.modelopt.qat import export_qat_config, export_qat_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]

@pytest.mark.parametrize(("layout", "moe"), list(PARALLEL_LAYOUTS.values()), ids=list(PARALLEL_LAYOUTS))
def test_two_gpu_export_equals_one_gpu_export(megatron_gpu, tmp_path, layout, moe):
    import dist_worker

    model = build_gpt(moe, dtype=torch.bfloat16, seed=11)
    state = full_state(model)
    model = qat(model.cuda())
    exported = [(name, tensor.cpu()) for name, tensor in export_qat_weights([model])]
    reference_config = export_qat_config([model])["hf_quant_config"]["quantization"]
    assert any(tensor.dtype == torch.uint8 for _, tensor in exported)  # NVFP4 was exported
    torch.save({"state": state, "exported": exported}, tmp_path / "reference.pt")

    spawn_ranks(dist_worker.run, 2,
                (2, rendezvous(tmp_path / "rendezvous"), str(tmp_path), layout, moe, "bfloat16", "cuda"), timeout=600)
    names = [name for name, _ in exported]
    dist_worker.assert_every_rank_matches(str(tmp_path), names, reference_config)
