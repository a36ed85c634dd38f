"""Behaviour that only a fresh interpreter shows: import order, import cost, hooks inside imports."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import json, sys
sys.path.insert(0, {root!r})
import patchkit
from patchkit import Patch, Replace, Variant, Wrap

def forward(self, x):
    return x + 1000

def broken_factory(original):
    raise RuntimeError("patch exploded during the user's import")

patchkit.engine().register(Patch(
    id="toy.forward", summary="s", why="w", upstream="u", removal="r",
    variants=(Variant(requires={{{dist!r}: ">=1"}}, installs=({action}({core!r} + ":Model.forward", {replacement}),)),),
))

def report():
    records = [r.to_dict() for r in patchkit.status("toy.*")]
    from {package}.core import Model
    sys.stdout.write(json.dumps({{"status": records, "forward": Model().forward(1)}}))
"""


def run(code: str, **env: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def prelude(up, action="Replace", replacement="forward") -> str:
    return PRELUDE.format(root=str(up.root), dist=up.dist, core=up.core, package=up.package,
                          action=action, replacement=replacement)


def test_apply_before_or_after_import_gives_identical_state_and_behaviour(make_upstream):
    up = make_upstream()
    before = run(prelude(up) + "patchkit.apply_all()\nimport %s.core\nreport()" % up.package)
    after = run(prelude(up) + "import %s.core\npatchkit.apply_all()\nreport()" % up.package)
    assert before == after
    assert before["forward"] == 1001 and before["status"][0]["state"] == "applied"


def test_patch_failing_inside_an_import_hook_does_not_break_the_import(make_upstream):
    up = make_upstream()
    code = prelude(up, action="Wrap", replacement="broken_factory")
    result = run(code + "patchkit.apply_all()\nimport %s.core\nreport()" % up.package)
    (record,) = result["status"]
    assert record["state"] == "failed" and "exploded" in record["error"]
    assert result["forward"] == 2  # the user's module imported fine and is unpatched


def test_strict_mode_lets_the_hook_failure_reach_the_import(make_upstream):
    up = make_upstream()
    code = prelude(up, action="Wrap", replacement="broken_factory")
    code += "patchkit.apply_all(strict=True)\nimport %s.core" % up.package
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "PatchInstallError" in result.stderr


UPSTREAMS = ("megatron", "vllm", "modelopt")


@pytest.mark.skipif(any(importlib.util.find_spec(name) for name in UPSTREAMS),
                    reason="an upstream is installed here: its patches wait for imports, which needs wrapt")
def test_import_and_apply_all_import_no_upstream_and_no_wrapt():
    code = textwrap.dedent("""
        import sys, json
        import patchkit
        patchkit.apply_all()
        heavy = ["torch", "megatron", "vllm", "modelopt", "wrapt", "transformer_engine"]
        sys.stdout.write(json.dumps(sorted(m for m in heavy if m in sys.modules)))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("argv", [["list"], ["status"], ["status", "--json"], ["status", "--no-import"]])
def test_cli_commands_run(argv):
    result = subprocess.run([sys.executable, "-m", "patchkit", *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    if "--json" in argv:
        records = json.loads(result.stdout)
        assert all({"id", "state", "reason", "variant", "versions"} <= set(r) for r in records)


def test_cli_explain_unknown_id_exits_2_with_a_suggestion():
    result = subprocess.run([sys.executable, "-m", "patchkit", "explain", "megatron.mtp_postproces"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "not a known patch id" in result.stderr
