"""The `patchkit` command as people use it: versions, help, formats, widths, pipes, exit statuses.

Each command runs in a fresh interpreter, as from a shell. Toy upstreams written to a temp folder
(real dist-info metadata, real packages) stand in where an upstream must be broken on purpose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import patchkit
from patchkit.cli import build_parser

WIDTH = 100


def patchkit_command(*args: str, env: dict[str, str] | None = None, stdin_closed: bool = False,
                     prelude: str = "") -> subprocess.CompletedProcess:
    """``python -m patchkit ARGS`` (or the entry point after ``prelude``) with no PATCHKIT_* set but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    clean.update(env or {})
    if env and "PYTHONPATH" in env and os.environ.get("PYTHONPATH"):  # keep the parent's path after the test's
        clean["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.environ["PYTHONPATH"]])
    if prelude:
        code = f"{prelude}\nimport sys\nsys.argv = ['patchkit', *{list(args)!r}]\nfrom patchkit.cli import main\n" \
               "sys.exit(main())"
        command = [sys.executable, "-c", code]
    else:
        command = [sys.executable, "-m", "patchkit", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=clean)


def closed_stdout(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``patchkit ARGS`` with its stdout a pipe whose reader is gone before anything is written
    (as `| head -1` is, by the time a long report is written). Returns (status, stderr)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    clean.update(env or {})
    read, write = os.pipe()
    os.close(read)  # no reader: every write to stdout fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "patchkit", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=300, env=clean)
    finally:
        os.close(write)
    return done.returncode, done.stderr


@pytest.mark.parametrize("args", [["list"], ["list", "--json"], ["status"], ["status", "--json"],
                                  ["explain", "megatron.mtp_postprocess"], ["doctor"], ["doctor", "--json"],
                                  ["--help"], ["--version"], ["matrix", "check"]])
def test_a_closed_stdout_ends_every_command_quietly_with_status_141(args):
    status, stderr = closed_stdout(*args)
    # argparse itself swallows the error of writing --help (and exits 0): quiet too.
    assert status == 141 or (args == ["--help"] and status == 0), stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr


def test_doctor_writes_its_record_before_a_closed_stdout_can_stop_it(tmp_path):
    record = tmp_path / "records.yaml"
    status, stderr = closed_stdout("doctor", "--verbose", "--record", str(record))
    assert status == 141, stderr
    assert record.is_file() and "schema: 1" in record.read_text()
    assert "Traceback" not in stderr


def test_version_names_the_distribution_from_the_packages_own_metadata():
    from importlib.metadata import packages_distributions, version

    import patchkit

    done = patchkit_command("--version")
    assert done.returncode == 0, done.stderr
    name, printed_version = done.stdout.split()[:2]
    assert printed_version == patchkit.__version__
    assert name in packages_distributions()["patchkit"] and version(name) == patchkit.__version__


def _subcommands() -> list[list[str]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    return [[]] + [[name] for name in commands if name != "matrix"] + [["matrix"], ["matrix", "merge"]]


@pytest.mark.parametrize("command", _subcommands(), ids=lambda c: " ".join(c) or "patchkit")
def test_help_shows_no_raw_restructuredtext(command):
    done = patchkit_command(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: patchkit" in done.stdout
    for markup in ("``", ":func:", ":mod:", ":class:", ":data:"):
        assert markup not in done.stdout


@pytest.mark.parametrize("args", [["-v", "doctor"], ["doctor", "-v"], ["doctor", "--verbose"],
                                  ["-v", "status"], ["status", "-v"], ["list", "--verbose"]])
def test_v_means_verbose_wherever_it_is_given(args):
    chosen = build_parser().parse_args(args)
    assert chosen.verbose is True
    assert getattr(chosen, "upstream_output", False) is False  # its own flag, --upstream-output


@pytest.mark.parametrize("args", [["status"], ["status", "-v"], ["doctor"], ["doctor", "-v"], ["list"]])
def test_every_line_fits_a_100_column_terminal(args):
    done = patchkit_command(*args)
    assert done.returncode == 0, done.stderr
    longest = max(done.stdout.splitlines(), key=len)
    assert len(longest) <= WIDTH, longest


def test_a_long_reason_is_cut_in_the_table_and_whole_with_verbose_or_json():
    from patchkit.report import status_table
    from patchkit.runtime.status import PatchStatus, State

    reason = "upstream moved the function " * 10
    record = PatchStatus(id="toy.forward", state=State.FAILED, error=reason.strip())
    cut = status_table([record]).splitlines()
    assert all(len(line) <= WIDTH for line in cut) and cut[-1].endswith("...")
    whole = status_table([record], full=True).splitlines()
    assert all(len(line) <= WIDTH for line in whole)
    assert " ".join(" ".join(whole[2:]).split()) == reason.strip()


def test_list_and_explain_speak_json():
    listed = patchkit_command("list", "--json")
    assert listed.returncode == 0, listed.stderr
    patches = json.loads(listed.stdout)
    mtp = next(p for p in patches if p["id"] == "megatron.mtp_postprocess")
    assert mtp["opt_in"] is True and mtp["variants"] and mtp["summary"]
    explained = patchkit_command("explain", "megatron.mtp_postprocess", "--json")
    assert explained.returncode == 0, explained.stderr
    found = json.loads(explained.stdout)
    assert found["id"] == "megatron.mtp_postprocess" and found["status"]["id"] == "megatron.mtp_postprocess"


def test_the_status_header_names_python_torch_and_every_upstream():
    done = patchkit_command("status", "--no-import")
    assert done.returncode == 0, done.stderr
    head = " ".join(done.stdout.split("PATCH ")[0].split())
    assert f"patchkit-rl {patchkit.__version__}," in head  # the name users install, not the import package's
    assert f"Python {sys.version.split()[0]}" in head and "torch" in head
    for upstream in ("megatron-core", "megatron-bridge", "nvidia-modelopt", "vllm"):
        assert upstream in head


@pytest.mark.parametrize("command", [["status"], ["doctor"]])
@pytest.mark.parametrize("variable, value", [("PATCHKIT_LOG_LEVEL", "verbose"),
                                             ("PATCHKIT_DISABLE", "megatron.mtp_postproces"),
                                             ("PATCHKIT_DISABLED", "megatron.mtp_postprocess")])
def test_status_and_doctor_exit_2_on_a_configuration_error_said_once(command, variable, value):
    done = patchkit_command(*command, env={variable: value})
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if variable in line]
    assert len(said) == 1 and said[0].startswith("patchkit: configuration: ")
    assert "PatchkitWarning" not in done.stderr and "config_error" not in done.stdout


@pytest.mark.parametrize("command", [["status", "--no-import"], ["doctor"]])
def test_json_and_another_format_together_are_refused_with_exit_2(command):
    done = patchkit_command(*command, "--json", "--format", "markdown")
    assert done.returncode == 2, done.stderr
    assert "--format='markdown'" in done.stderr and "in conflict with --json" in done.stderr
    assert done.stdout == ""


def test_list_says_a_configuration_error_without_failing():
    done = patchkit_command("list", env={"PATCHKIT_LOG_LEVEL": "verbose"})
    assert done.returncode == 0 and "PATCHKIT_LOG_LEVEL='verbose'" in done.stderr


def test_the_opt_in_hint_of_status_is_exactly_what_turns_it_on():
    records = json.loads(patchkit_command("status", "--json", "--no-import").stdout)
    mtp = next(r for r in records if r["id"] == "megatron.mtp_postprocess")
    assert mtp["reason"] == "opt_in" and mtp["detail"].endswith("enable with PATCHKIT_OPT_IN=megatron.mtp_postprocess")
    variable, value = mtp["detail"].rsplit(" ", 1)[1].split("=")
    done = patchkit_command("status", "--json", "--no-import", env={variable: value})
    assert done.returncode == 0, done.stderr
    after = {r["id"]: r for r in json.loads(done.stdout)}
    assert after["megatron.mtp_postprocess"]["reason"] != "opt_in"
    assert {r["reason"] for r in after.values()} <= {None, "not_installed", "opt_in", "native"}
    assert "disabled" not in {r["reason"] for r in after.values()}


def test_doctor_on_cuda_without_cuda_is_one_line_and_exit_2(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '2.9.0+cpu'\n"
                                      "class version:\n    cuda = None\n"
                                      "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n")
    done = patchkit_command("doctor", "--device", "cuda", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "patchkit: --device='cuda' is unavailable (torch 2.9.0+cpu is built without CUDA); accepted: auto or cpu"]
    assert done.stdout == ""


def test_doctor_can_be_pasted_as_markdown():
    done = patchkit_command("doctor", "--format", "markdown", "--patch", "megatron.*")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "### patchkit doctor" and "| patch | verdict | seconds | message |" in lines
    assert any(line.startswith("| `megatron.mtp_postprocess` |") for line in lines)


BROKEN_DECLARATIONS = '''
from patchkit import Patch, Replace, Variant


def forward(self, x):
    return "patched"


PATCHES = [
    Patch(id=f"toybroken.{name}", summary="s", why="w", upstream="u", removal="r",
          variants=(Variant(requires={"toybroken": ">=1"},
                            installs=(Replace(f"toybroken.core:Model.{name}", forward),)),))
    for name in ("forward", "backward", "scale")
]
'''


@pytest.fixture
def broken_stack(tmp_path: Path) -> dict[str, str]:
    """An upstream, toybroken 1.0, whose module imports a dependency that is not installed (its
    metadata requires toydep>=2), and declarations of three patches for it."""
    (tmp_path / "toybroken").mkdir()
    (tmp_path / "toybroken" / "__init__.py").write_text("")
    (tmp_path / "toybroken" / "core.py").write_text("import toydep\n\nclass Model:\n    def forward(self, x):\n"
                                                    "        return x\n")
    info = tmp_path / "toybroken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toybroken\nVersion: 1.0\nRequires-Dist: toydep>=2\n"
                                   "Requires-Dist: toyextra; extra == 'more'\n")
    (tmp_path / "toybroken_patches.py").write_text(textwrap.dedent(BROKEN_DECLARATIONS))
    return {"PYTHONPATH": str(tmp_path), "PATCHKIT_EXTRA_PATCHES": "toybroken_patches"}


@pytest.mark.parametrize("command", [["doctor"], ["status"]])
def test_an_upstream_that_does_not_import_is_one_environment_problem_with_its_fix(broken_stack, command):
    done = patchkit_command(*command, env=broken_stack)
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert out.count("environment problem: toybroken 1.0 does not import") == 1
    assert "No module named 'toydep'" in out
    assert "conflict: toybroken 1.0 requires toydep>=2, but it is not installed" in out
    assert "fix: pip install 'toydep>=2'" in out and "toyextra" not in out
    lines = out.splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith(("BLCK", "toybroken."))]
    assert len(rows) == 3, out
    assert all("blocked" in lines[i] or "blocked" in lines[i + 1] for i in rows), out
    assert "FAIL " not in out
    assert "toydep" not in done.stderr  # not once more per patch


def test_doctor_json_carries_the_environment_problem_and_no_progress(broken_stack):
    done = patchkit_command("doctor", "--json", "--verbose", env=broken_stack)
    report = json.loads(done.stdout)
    (problem,) = report["environment"]
    assert problem["distribution"] == "toybroken" and problem["fix"].startswith("pip install 'toydep>=2'")
    assert {p["verdict"] for p in report["patches"] if p["id"].startswith("toybroken.")} == {"blocked"}
    assert report["stack"]["python"] == sys.version.split()[0]
    assert "importing toybroken ... does not import" in done.stderr


OPTIONAL_DECLARATIONS = '''
from patchkit import Patch, Replace, Variant


def forward(self, x):
    return "patched"


PATCHES = [
    Patch(id=f"toyoptional.{name}", summary="s", why="w", upstream="u", removal="r",
          variants=(Variant(requires={"toyoptional": ">=1"},
                            installs=(Replace(f"toyoptional.{name}:Model.forward", forward),)),))
    for name in ("core", "cluster")
]
'''


@pytest.fixture
def optional_stack(tmp_path: Path) -> dict[str, str]:
    """An upstream, toyoptional 1.0, one of whose modules imports a package it does not require and
    that is not installed (as vLLM's Ray executor imports Ray), and a patch for each of its modules."""
    package = tmp_path / "toyoptional"
    package.mkdir()
    (package / "__init__.py").write_text("")
    model = "class Model:\n    def forward(self, x):\n        return x\n"
    (package / "core.py").write_text(model)
    (package / "cluster.py").write_text("import toyclusterlib\n\n" + model)
    info = tmp_path / "toyoptional-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyoptional\nVersion: 1.0\n"
                                   "Requires-Dist: toyclusterlib; extra == 'cluster'\n")
    (tmp_path / "toyoptional_patches.py").write_text(textwrap.dedent(OPTIONAL_DECLARATIONS))
    return {"PYTHONPATH": str(tmp_path), "PATCHKIT_EXTRA_PATCHES": "toyoptional_patches"}


def test_a_module_that_needs_a_package_not_installed_makes_its_patch_not_applicable(optional_stack):
    done = patchkit_command("doctor", "--json", "--patch", "toyoptional.*", env=optional_stack)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["environment"] == []
    verdicts = {p["id"]: p for p in report["patches"]}
    assert verdicts["toyoptional.cluster"]["verdict"] == "not_applicable"
    assert "toyoptional.cluster imports only with toyclusterlib, which is not installed here" \
        in verdicts["toyoptional.cluster"]["message"]
    assert verdicts["toyoptional.core"]["verdict"] != "blocked"
    assert "importing toyoptional.cluster failed" not in done.stderr
    status = patchkit_command("status", env=optional_stack)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "does not import" not in status.stdout and "failed" not in status.stderr


def test_progress_is_said_on_stderr_with_verbose_only(broken_stack):
    quiet = patchkit_command("status", env=broken_stack)
    assert "importing toybroken" not in quiet.stderr + quiet.stdout  # stderr is no terminal here
    loud = patchkit_command("status", "-v", env=broken_stack)
    assert "importing toybroken ..." in loud.stderr and "importing" not in loud.stdout


BLOCK_TOOLING = ("import sys\n"
                 "for name in ('yaml', 'packaging'):\n"
                 "    sys.modules[name] = None  # as if not installed: importing it raises ModuleNotFoundError\n")


@pytest.mark.parametrize("args", [["list"], ["status"], ["status", "--json"], ["explain", "vllm.fp8_refit"],
                                  ["doctor"], ["--version"], ["--help"], ["run", "--", sys.executable, "-c", "0"]])
def test_every_command_but_matrix_works_without_the_matrix_tooling(args):
    done = patchkit_command(*args, prelude=BLOCK_TOOLING)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_matrix_without_its_tooling_says_what_to_install_in_one_line():
    done = patchkit_command("matrix", "check", prelude=BLOCK_TOOLING)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("patchkit: matrix needs PyYAML and packaging") and "[matrix]'" in line
