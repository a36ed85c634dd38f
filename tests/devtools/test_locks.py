"""devtools.locks: what a session's constraints file is made from, and catching a stale one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from devtools.locks import StaleLockError, check, inputs_for, render  # noqa: E402

STEPS = [["torch==2.13.0"], ["megatron-core==0.16.1", "einops"], ["--no-deps", "megatron-bridge==0.3.1"],
         ["megatron-core @ git+https://github.com/NVIDIA/Megatron-LM@d98e8a6"]]
COMPILED = ("einops==0.8.1 \\\n    --hash=sha256:aa\ntorch==2.13.0 \\\n    --hash=sha256:bb \\\n    --hash=sha256:cc\n"
            "triton==3.7.1 \\\n    --hash=sha256:dd\n")


def test_no_deps_pins_and_direct_references_are_kept_as_they_are_not_resolved(tmp_path):
    inputs = inputs_for("3.11", STEPS, tmp_path)
    assert inputs.requirements == ("torch==2.13.0", "megatron-core==0.16.1", "einops", "packaging>=23",
                                   "PyYAML>=6", "pytest", "pytest-xdist")
    assert inputs.unresolved == ("megatron-bridge==0.3.1",
                                 "megatron-core @ git+https://github.com/NVIDIA/Megatron-LM@d98e8a6")


def test_torch_keeps_its_pin_but_not_its_hashes_and_the_others_keep_theirs(tmp_path):
    text = render("tests-x", inputs_for("3.11", STEPS, tmp_path), COMPILED)
    assert "torch==2.13.0\ntriton==3.7.1 \\\n    --hash=sha256:dd" in text
    assert "sha256:bb" not in text and "einops==0.8.1 \\\n    --hash=sha256:aa" in text
    assert text.rstrip().endswith("megatron-core @ git+https://github.com/NVIDIA/Megatron-LM@d98e8a6")


def test_a_lock_made_from_other_requirements_or_missing_is_stale(tmp_path):
    inputs = inputs_for("3.11", STEPS, tmp_path)
    lock = tmp_path / "tests-x.txt"
    with pytest.raises(StaleLockError, match="is missing: run `python3 -m nox -s lock -- tests-x`"):
        check(lock, inputs, "tests-x")
    lock.write_text(render("tests-x", inputs, COMPILED))
    check(lock, inputs, "tests-x")
    for changed in (inputs_for("3.12", STEPS, tmp_path), inputs_for("3.11", STEPS[:2], tmp_path)):
        with pytest.raises(StaleLockError, match="other requirements"):
            check(lock, changed, "tests-x")


def test_an_override_files_content_is_part_of_the_inputs(tmp_path):
    (tmp_path / "overrides.txt").write_text("certifi>=2026.10.19\n")
    steps = [["--override", "overrides.txt", "vllm==0.33.0"]]
    before = inputs_for("3.12", steps, tmp_path)
    assert before.overrides == ("overrides.txt",) and "overrides.txt" not in before.requirements
    (tmp_path / "overrides.txt").write_text("certifi>=2026.11.1\n")
    assert inputs_for("3.12", steps, tmp_path).digest() != before.digest()


def test_a_lock_that_is_a_directory_or_not_text_is_stale_with_a_one_line_message(tmp_path):
    inputs = inputs_for("3.11", STEPS, tmp_path)
    folder = tmp_path / "tests-x.txt"
    folder.mkdir()
    binary = tmp_path / "tests-y.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage\n# inputs sha256:" + b"0" * 64 + b"\n")
    for lock in (folder, binary):
        with pytest.raises(StaleLockError) as caught:
            check(lock, inputs, "tests-x")
        assert str(lock) in str(caught.value) and "nox -s lock" in str(caught.value)
        assert "\n" not in str(caught.value)
