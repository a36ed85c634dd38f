"""Behaviour that only a fresh interpreter shows: import order, import cost, hooks inside imports."""

from __future__ import annotations

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
    return PRELUDE.format(root=str(up.root), dist=up.name, core=up.core, package=up.package,
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


def test_import_and_apply_all_import_no_upstream_and_no_tooling_dependency():
    """Installed upstreams or not: their patches wait on patchkit's own import hook, not wrapt's."""
    code = textwrap.dedent("""
        import sys, json
        import patchkit
        patchkit.apply_all()
        heavy = ["torch", "megatron", "vllm", "modelopt", "transformer_engine", "wrapt", "packaging", "yaml"]
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


EXTRA_TARGET = '''
import os

os.write(1, b"upstream chatter on fd 1\\n")  # what a C extension or a print at import does


class Model:
    def forward(self, x):
        return x + 1
'''

EXTRA_DECLARATION = '''
from patchkit import Patch, Replace, Variant


def forward(self, x):
    return x + 1000


PATCHES = (Patch(id="extra.forward", summary="adds 1000", why="w", upstream="u", removal="r",
                 variants=(Variant(requires={{{dist!r}: ">=1"}},
                                   installs=(Replace("{package}.chatty:Model.forward", forward),)),)),)
'''

TWICE_DECLARATION = '''
from patchkit import Patch, Replace, Variant

def _patch(patch_id):
    return Patch(id=patch_id, summary="s", why="w", upstream="u", removal="r",
                 variants=(Variant(requires={{{dist!r}: ">=1"}},
                                   installs=(Replace("{package}.chatty:Model.forward", print),)),))

PATCHES = (_patch("extra.first"), _patch("extra.twice"), _patch("extra.twice"))
'''


@pytest.fixture
def extra(make_upstream):
    up = make_upstream()
    (up.root / up.package / "chatty.py").write_text(EXTRA_TARGET)
    (up.root / up.package / "decl.py").write_text(EXTRA_DECLARATION.format(dist=up.name, package=up.package))
    (up.root / up.package / "twice.py").write_text(TWICE_DECLARATION.format(dist=up.name, package=up.package))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(up.root), *filter(None, [env.get("PYTHONPATH")])])
    return up, env


def cli(env, *argv, **extra_env):
    return subprocess.run([sys.executable, "-m", "patchkit", *argv], capture_output=True, text=True, timeout=120,
                          env={**env, **extra_env})


def test_cli_status_and_explain_see_extra_patches_and_stdout_stays_clean_at_the_fd_level(extra):
    up, env = extra
    result = cli(env, "status", "--json", PATCHKIT_EXTRA_PATCHES=f"{up.package}.decl")
    assert result.returncode == 0, result.stderr
    records = {r["id"]: r for r in json.loads(result.stdout)}  # parseable: the chatter was captured
    assert records["extra.forward"]["state"] == "applied"
    assert "upstream chatter on fd 1" not in result.stderr and "upstreams printed 1 line(s)" in result.stderr
    shown = cli(env, "status", "--json", "--upstream-output", PATCHKIT_EXTRA_PATCHES=f"{up.package}.decl")
    assert json.loads(shown.stdout) and "upstream chatter on fd 1" in shown.stderr
    explained = cli(env, "explain", "extra.forward", PATCHKIT_EXTRA_PATCHES=f"{up.package}.decl")
    assert explained.returncode == 0, explained.stderr
    assert "extra.forward" in explained.stdout and "in this interpreter: pending" in explained.stdout
    listed = cli(env, "list", PATCHKIT_EXTRA_PATCHES=f"{up.package}.decl")
    assert listed.returncode == 0 and "extra.forward" in listed.stdout


def test_a_declaration_module_declaring_one_id_twice_registers_none_of_its_patches(extra):
    up, env = extra
    result = cli(env, "status", "--json", PATCHKIT_EXTRA_PATCHES=f"{up.package}.twice,{up.package}.decl")
    assert result.returncode == 0, result.stderr
    ids = {r["id"] for r in json.loads(result.stdout)}
    assert "extra.forward" in ids and not ids & {"extra.first", "extra.twice"}
    assert "declares patch id 'extra.twice' twice" in result.stderr


def test_catalogue_module_declaring_one_id_twice_is_a_declaration_error(tmp_path, monkeypatch):
    from patchkit import DeclarationError
    from patchkit.runtime import catalogue

    (tmp_path / "pk_twice_decl.py").write_text(
        "from patchkit import Patch, Variant\n"
        "P = Patch(id='x.y', summary='s', why='w', upstream='u', removal='r',"
        " variants=(Variant(requires={'d': '>=1'}, native='n'),))\nPATCHES = (P, P)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DeclarationError, match="twice"):
        catalogue.declarations("pk_twice_decl")


def test_status_json_stdout_is_clean_when_an_import_writes_to_fd_1(monkeypatch, capfd):
    import patchkit
    from patchkit.cli import main

    original = patchkit.Engine.import_targets

    def chatty_import_targets(self, leave=()):
        os.write(1, b"upstream chatter on fd 1\n")  # a target module's import writing below Python
        print("upstream chatter through sys.stdout")
        return original(self, leave)

    monkeypatch.setattr(patchkit.Engine, "import_targets", chatty_import_targets)
    assert main(["status", "--json"]) in (0, 1)
    out, err = capfd.readouterr()
    assert isinstance(json.loads(out), list)
    assert "upstream chatter" not in err and "upstreams printed 2 line(s)" in err
    assert main(["status", "--json", "--upstream-output"]) in (0, 1)
    out, err = capfd.readouterr()
    assert isinstance(json.loads(out), list)
    assert "upstream chatter on fd 1" in err and "upstream chatter through sys.stdout" in err
