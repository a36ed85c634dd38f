"""`patchkit doctor --device cuda` over the Megatron-Core and ModelOpt patches, on a GPU.

The whole command in a fresh process, as a user runs it: every applicable Megatron check runs its
tiny model on CUDA (NCCL, one rank), and the NVFP4 check also compares the CPU backend with
ModelOpt's own CUDA kernel. Nothing may be ``failed`` or ``needs_gpu``; every patch that applies
here must be ``verified``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_doctor_on_cuda_verifies_every_applicable_megatron_and_modelopt_patch(record_property):
    done = subprocess.run(
        [sys.executable, "-m", "patchkit", "doctor", "--json", "--device", "cuda",
         "--patch", "megatron.*", "--patch", "modelopt.*"],
        capture_output=True, text=True, timeout=900,
    )
    report = json.loads(done.stdout)
    verdicts = {p["id"]: (p["verdict"], p["message"], p["seconds"]) for p in report["patches"]}
    record_property("doctor_cuda", json.dumps({"verdicts": verdicts, "total_seconds": report["total_seconds"],
                                               "import_and_apply_seconds": report["import_and_apply_seconds"]}))
    sys.stderr.write(json.dumps(verdicts, indent=1) + "\n")
    assert report["device"] == "cuda"
    applicable = {pid: v for pid, v in verdicts.items() if v[0] != "not_applicable"}
    assert "modelopt.nvfp4_cpu_fake_quant" in applicable
    assert {pid: v[0] for pid, v in applicable.items()} == dict.fromkeys(applicable, "verified"), applicable
    assert done.returncode == 0, done.stderr[-3000:]
