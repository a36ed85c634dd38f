"""One rank of a job that exports a parallel QAT model and compares it with the single-rank export.

The parent test exports the same weights at TP=EP=PP=1 and saves ``reference.pt`` (the full
parameters and the exported ``(name, tensor)`` list, on the CPU). Each rank here builds its part of
the model for the layout it is given, loads its shard of those weights, applies QAT, exports, and
writes ``rank<r>.json``: the names in order and any tensor that differs. ``device="cpu"``: gloo,
``cpu_harness`` for Megatron's CUDA-only calls and the CPU fake-quant backend. ``device="cuda"``: NCCL,
one GPU a rank, nothing stood in (ModelOpt's CUDA kernel quantizes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def run(rank: int, world_size: int, init_method: str, out_dir: str, layout: dict, moe: bool, dtype_name: str,
        device: str = "cpu") -> None:
    """One rank, started by ``tests/_multiprocess.spawn_ranks``; meets the others through ``init_method``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "megatron"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    # A fresh rank runs no conftest: ModelOpt 0.48's Megatron plugin needs the TE harness (tests/te_harness.py).
    from te_harness import load_modelopt_megatron_plugin

    load_modelopt_megatron_plugin()
    import contextlib

    import torch
    from _multiprocess import init_rank
    from cpu_harness import cpu_megatron
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    on_gpu = device == "cuda"
    if on_gpu:
        torch.cuda.set_device(rank)
    init_rank(rank, world_size, init_method, "nccl" if on_gpu else "gloo")
    try:
        from megatron.core.transformer.moe import moe_utils

        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None
        from export_models import build_gpt, load_shard, qat
        from patchkit.patches.modelopt.qat import export_qat_config, export_qat_weights

        import patchkit

        dtype = getattr(torch, dtype_name)
        reference = torch.load(Path(out_dir, "reference.pt"), weights_only=True)
        harness = contextlib.nullcontext() if on_gpu else cpu_megatron()
        fake_quant = contextlib.nullcontext() if on_gpu else patchkit.applied("modelopt.nvfp4_cpu_fake_quant")
        with harness, fake_quant:
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=layout.get("tp", 1),
                pipeline_model_parallel_size=layout.get("pp", 1),
                expert_model_parallel_size=layout.get("ep", 1),
            )
            model_parallel_cuda_manual_seed(1234)
            overrides = dict(
                tensor_model_parallel_size=layout.get("tp", 1),
                pipeline_model_parallel_size=layout.get("pp", 1),
                expert_model_parallel_size=layout.get("ep", 1),
            )
            if layout.get("pp", 1) > 1:
                overrides["pipeline_dtype"] = dtype
            model = build_gpt(moe, dtype=dtype, **overrides)
            if on_gpu:
                model = model.cuda()
            load_shard(model, reference["state"])
            model = qat(model)
            exported = [(name, tensor.cpu()) for name, tensor in export_qat_weights([model])]
            config = export_qat_config([model])
            parallel_state.destroy_model_parallel()
        expected = reference["exported"]
        names = [name for name, _ in exported]
        differ = []
        for (name, tensor), (ref_name, ref_tensor) in zip(exported, expected, strict=False):
            if name != ref_name:
                continue
            same = tensor.dtype == ref_tensor.dtype and tensor.shape == ref_tensor.shape and torch.equal(
                tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor,
                ref_tensor.view(torch.uint8) if ref_tensor.dtype == torch.float8_e4m3fn else ref_tensor,
            )
            if not same:
                differ.append(name)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
            {"names": names, "differ": differ, "config": config["hf_quant_config"]["quantization"]}))
    finally:
        torch.distributed.destroy_process_group()


def assert_every_rank_matches(out_dir: str, names: list[str], config: object, world_size: int = 2) -> None:
    """Each rank's ``rank<r>.json``: the reference's names in its order, no tensor that differs, its quant config."""
    for rank in range(world_size):
        result = json.loads(Path(out_dir, f"rank{rank}.json").read_text())
        assert result["names"] == names, (rank, set(result["names"]) ^ set(names))
        assert result["differ"] == [], (rank, result["differ"])
        assert result["config"] == config
