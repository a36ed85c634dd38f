"""The test suite runs as one pytest session, and each upstream's folder skips without that upstream.

pytest imports test helpers by their file name (``rootdir``-relative folders are put on ``sys.path``,
no packages), so two helpers with one name in two folders clash: the second folder's tests import
the first folder's module (``tests/megatron/cpu_harness.py`` and ``tests/vllm/cpu_harness.py`` did,
and ``pytest tests/`` stopped at collection). A conftest that raises pytest's skip while it is loaded
aborts the run instead of skipping (``pytest tests/vllm`` without vLLM did).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_helpers_share_a_module_name() -> None:
    folders = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py" and not (path.parent / "__init__.py").exists():
            folders[path.stem].append(str(path.parent.relative_to(TESTS)))
    clashes = {name: where for name, where in folders.items() if len(where) > 1}
    assert not clashes, f"helper modules with one name in several folders: {clashes}"


def test_the_vllm_tests_skip_without_vllm(tmp_path: Path) -> None:
    hidden = tmp_path / "vllm"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('vLLM hidden for this test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(TESTS / "vllm"), "-q", "-p", "no:cacheprovider", "-rs"],
        cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=300,
    )
    # 5: "no tests collected", pytest's code when every module was skipped at collection
    assert result.returncode in (0, 5), result.stdout + result.stderr
    assert "skipped" in result.stdout and "vLLM is not installed" in result.stdout, result.stdout
    assert "error" not in result.stdout.lower(), result.stdout


def test_the_whole_suite_collects_as_one_session() -> None:
    """``pytest tests/`` in whatever environment runs this (CI's engine one has neither torch nor vLLM):
    every folder collects or skips. Two ways it broke: ``tests/megatron/conftest.py`` imported torch before
    skipping without megatron-core, and ``tests/vllm/conftest.py`` took ``tests/vllm`` itself, importable as
    a namespace package ``vllm`` once another folder's conftest put ``tests/`` on ``sys.path``, for vLLM."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(TESTS), "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=600,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0 and "error" not in summary, result.stdout[-4000:] + result.stderr[-2000:]
