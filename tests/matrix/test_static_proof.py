"""`matrix static` reproduces the upstream drift report for megatron-core 0.14-0.19 and vLLM 0.12-0.29.

Needs the 24 release artifacts (about 1 GB to download once, the 509 MB vLLM 0.15.1 wheel
included; 0.8 GB of .py files stay in the cache) and the report itself, so it is not part of CI:
it runs only where MATRIX_STATIC_CACHE (default: /work/cache/patchkit-artifacts, then
~/.cache/patchkit/artifacts) already holds every release, and skips otherwise. Fill the cache with
``python tests/matrix/proof/compare_drift_report.py --cache DIR`` (it downloads what is missing).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from patchkit.matrix.artifacts import DEFAULT_CACHE

from .proof import compare_drift_report as proof

SYMBOLS = Path(proof.__file__).parent / "upstream_symbols.yaml"


def _cache() -> Path | None:
    wanted = yaml.safe_load(SYMBOLS.read_text())
    candidates = [Path(os.environ["MATRIX_STATIC_CACHE"])] if "MATRIX_STATIC_CACHE" in os.environ else [
        Path("/work/cache/patchkit-artifacts"), DEFAULT_CACHE]
    for cache in candidates:
        if all((cache / dist / version / ".complete").is_file()
               for dist, spec in wanted.items() for version in spec["versions"]):
            return cache
    return None


CACHE = _cache()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CACHE is None, reason="release artifacts not cached (network proof, not run in CI)"),
    pytest.mark.skipif(not proof.DEFAULT_REPORT.is_file(), reason=f"{proof.DEFAULT_REPORT} not here"),
]


def test_static_facts_match_the_drift_report(capsys) -> None:
    assert proof.main(["--cache", str(CACHE)]) == 0
    out = capsys.readouterr().out
    assert ("megatron-core: 6 releases x 18 symbols: 108 cells (presence), 93 source hashes, 24 change markers, "
            "93 full signatures compared; 0 disagreement(s)") in out
    assert ("vllm: 18 releases x 25 symbols: 450 cells (presence), 423 source hashes, 14 change markers, "
            "423 full signatures compared; 0 disagreement(s)") in out
    assert "total: 558 cells, 0 disagreement(s)" in out


def test_the_comparison_catches_a_wrong_fact(tmp_path: Path, capsys) -> None:
    report = proof.DEFAULT_REPORT.read_text()
    wrong = report.replace("| 0.16.1 | ✓ `ed016a1` |", "| 0.16.1 | ✓ `ed016a2` |", 1)
    wrong = wrong.replace("  - 0.14.0 – 0.15.3: `(tensor, shifts=-1, dims=-1, cp_group=None)`",
                          "  - 0.14.0 – 0.15.3: `(tensor, shifts=-1, dims=-1)`", 1)
    assert wrong.count("ed016a2") == 1
    (tmp_path / "report.md").write_text(wrong)
    assert proof.main(["--cache", str(CACHE), "--report", str(tmp_path / "report.md")]) == 1
    out = capsys.readouterr().out
    assert "megatron-core 0.16.1 GPTModel._postprocess: source hash ed016a1, report ed016a2" in out
    assert "megatron-core 0.14.0 roll_tensor: signature" in out and "megatron-core 0.15.3 roll_tensor: signature" in out
    assert "total: 558 cells, 3 disagreement(s)" in out
