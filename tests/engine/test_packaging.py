"""The distribution as a user installs it: the wheel and sdist built from the tree, installed into
clean venvs. setup.py finds the packages from the folders (patches/ ships as patchkit.patches)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _packages_in(folder: pathlib.Path, dotted: str) -> set[str]:
    return {
        ".".join([dotted, *init.parent.relative_to(folder).parts])
        for init in folder.rglob("__init__.py") if "__pycache__" not in init.parts
    }


# --- the built distributions, installed where nothing else is --------------------------------------

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

#: Run in the clean venv: apply_all with no upstream and no tooling dependency, then every entry
#: point of the distribution loaded through importlib.metadata, as its host loads it.
IN_CLEAN_VENV = r"""
import importlib.metadata, importlib.util, json, pkgutil, sys
import patchkit
WITH_TOOLING = sys.argv[1] == "tooled"
from patchkit._version import DISTRIBUTION_NAME

records = patchkit.apply_all()
dist = importlib.metadata.distribution(DISTRIBUTION_NAME)
loaded = {}
for ep in dist.entry_points:
    if ep.group == "console_scripts" and not WITH_TOOLING:
        continue  # the command line is checked on its own below
    target = ep.load()  # verl.plugins: resolving the name is the hook (patches/entry_points.py)
    if ep.group in ("vllm.general_plugins", "sglang.srt.plugins"):
        target()  # their hosts call what they load
    loaded[ep.group] = ep.value
site_packages = __import__("site").getsitepackages()[0]
start = pkgutil.resolve_name(open(site_packages + "/zz_patchkit_autoload.start").read().strip())
print(json.dumps({
    "name": dist.metadata["Name"], "version": dist.version, "patchkit_version": patchkit.__version__,
    "file": patchkit.__file__, "states": sorted({r.state.value for r in records}), "count": len(records),
    "loaded": loaded, "start_callable": callable(start),
    "tooling_present": [m for m in ("yaml", "packaging") if importlib.util.find_spec(m)],
}))
"""


def _uv() -> str:
    found = shutil.which("uv")
    assert found, "uv is needed to build and install the distributions (devtools/tools.txt installs it)"
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The sdist, and the wheel built from it (``uv build``), as a user's installer would get them."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([_uv(), "build", "-q", "--out-dir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("patchkit_rl-*.whl")
    (sdist,) = out.glob("patchkit_rl-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def _venv(built: dict[str, pathlib.Path], root: pathlib.Path, extras: str = "") -> pathlib.Path:
    venv = root / "venv"
    for command in ([_uv(), "venv", "-q", "--python", sys.executable, str(venv)],
                    [_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                     f"patchkit-rl{extras} @ {built['wheel'].as_uri()}"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "VIRTUAL_ENV": ""})
        assert done.returncode == 0, done.stderr
    return venv


@pytest.fixture(scope="module")
def clean_venv(built, tmp_path_factory) -> pathlib.Path:
    """A new venv holding only the wheel (no upstream, no PyYAML, no packaging); its root."""
    return _venv(built, tmp_path_factory.mktemp("clean"))


@pytest.fixture(scope="module")
def tooled_venv(built, tmp_path_factory) -> pathlib.Path:
    """A new venv holding the wheel with its ``[matrix]`` extra (the tooling), no upstream."""
    return _venv(built, tmp_path_factory.mktemp("tooled"), "[matrix]")


def _patchkit_free_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PATCHKIT_", "PYTHON", "VIRTUAL_ENV"))}


def test_the_distribution_is_patchkit_rl_and_the_import_package_stays_patchkit():
    from patchkit._version import DISTRIBUTION_NAME, __version__

    assert PROJECT["name"] == DISTRIBUTION_NAME == "patchkit-rl"
    assert PROJECT["version"] == __version__
    assert "patchkit" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def test_apply_all_needs_no_dependency_and_the_tooling_is_an_extra():
    assert PROJECT["dependencies"] == []
    assert {"packaging>=23", "PyYAML>=6"} == set(PROJECT["optional-dependencies"]["matrix"])


def test_each_upstream_extra_has_an_upper_bound():
    extras = PROJECT["optional-dependencies"]
    for extra in ("megatron", "modelopt", "bridge", "vllm"):
        upstream = extras[extra][0]
        assert ">=" in upstream and ",<" in upstream, f"[{extra}] {upstream} needs a lower and an upper bound"


@pytest.mark.slow
def test_every_source_package_ships_in_the_wheel(built):
    in_tree = _packages_in(ROOT / "patchkit", "patchkit") | _packages_in(ROOT / "patches", "patchkit.patches")
    with zipfile.ZipFile(built["wheel"]) as wheel:
        shipped = {name[: -len("/__init__.py")].replace("/", ".") for name in wheel.namelist()
                   if name.endswith("/__init__.py")}
    assert in_tree - shipped == set(), "setup.py's package list misses these folders"
    assert shipped - in_tree == set()


@pytest.mark.slow
def test_every_data_file_of_the_engine_ships_in_the_wheel(built):
    """Files patchkit reads at run time beside its modules (the matrix, the grid page's stylesheet)."""
    in_tree = {path.relative_to(ROOT).as_posix() for path in (ROOT / "patchkit").rglob("*")
               if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts}
    assert "patchkit/matrix/grid.css" in in_tree
    with zipfile.ZipFile(built["wheel"]) as wheel:
        assert in_tree - set(wheel.namelist()) == set(), "pyproject.toml's package-data misses these files"


def test_the_wheel_and_the_sdist_carry_the_license_and_the_metadata(built):
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = wheel.namelist()
        (licensed,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert wheel.read(licensed).decode() == license_text
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = wheel.read(meta).decode()
        for hook in ("zz_patchkit_autoload.pth", "zz_patchkit_autoload.start", "_patchkit_autoload.py"):
            assert hook in names
    header = metadata.split("\n\n", 1)[0]
    assert "Name: patchkit-rl" in header and "License-Expression: Apache-2.0" in header
    assert "Project-URL: Repository, https://" in header and "Classifier: Typing :: Typed" in header
    assert "Keywords: " in header and "Provides-Extra: matrix" in header
    assert "Description-Content-Type: text/markdown" in header  # the index renders the README as Markdown
    with tarfile.open(built["sdist"]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        assert sdist.extractfile(f"{top}/LICENSE").read().decode() == license_text  # type: ignore[union-attr]


def _apply_and_load_entry_points(venv: pathlib.Path, kind: str) -> dict:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", IN_CLEAN_VENV, kind], capture_output=True,
                          text=True, timeout=300, cwd=venv, env=_patchkit_free_environ())
    assert done.returncode == 0, done.stderr
    facts: dict = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["name"] == "patchkit-rl" and facts["version"] == facts["patchkit_version"]
    assert str(venv) in facts["file"]  # the installed wheel, not the source tree
    assert facts["count"] >= 30 and facts["states"] == ["skipped"]  # nothing installed to patch
    assert facts["start_callable"]
    return facts


PLUGINS = {"vllm.general_plugins": "patchkit.patches.entry_points:vllm",
           "sglang.srt.plugins": "patchkit.patches.entry_points:sglang",
           "verl.plugins": "patchkit.patches.entry_points:verl_applied"}


@pytest.mark.slow
def test_the_wheel_applies_in_a_clean_venv_with_no_upstream_and_no_tooling(clean_venv):
    facts = _apply_and_load_entry_points(clean_venv, "clean")
    assert facts["tooling_present"] == []
    assert facts["loaded"] == PLUGINS


@pytest.mark.slow
def test_every_entry_point_loads_from_the_wheel_with_the_tooling_extra(tooled_venv):
    facts = _apply_and_load_entry_points(tooled_venv, "tooled")
    assert facts["tooling_present"] == ["yaml", "packaging"]
    assert facts["loaded"] == {"console_scripts": "patchkit.cli:main", **PLUGINS}


def _run_console_script(venv: pathlib.Path, arguments: list[str]) -> None:
    done = subprocess.run([str(venv / "bin" / "patchkit"), *arguments], capture_output=True, text=True,
                          timeout=300, cwd=venv, env=_patchkit_free_environ())
    assert done.returncode == 0, done.stderr
    expected = "usage" if arguments == ["--help"] else "megatron.mtp_postprocess"
    assert expected in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("arguments", [["--help"], ["list"]])
def test_the_console_script_runs_from_a_clean_venv(tooled_venv, arguments):
    _run_console_script(tooled_venv, arguments)


@pytest.mark.slow
@pytest.mark.parametrize("arguments", [["--help"], ["list"], ["status"]])
def test_the_console_script_runs_without_the_tooling_extra(clean_venv, arguments):
    _run_console_script(clean_venv, arguments)


@pytest.mark.slow
def test_the_start_file_and_the_pth_line_run_the_hook_once(clean_venv):
    """Below Python 3.15 site runs the .pth line; calling the .start entry point afterwards (as a
    3.15+ site would instead) finds the hook already run and does nothing."""
    probe = ("import pkgutil\nimport patchkit.processes.autoload as autoload\n"
             "first = autoload._outcome\nassert first is not None and first.ran, first\n"
             "pkgutil.resolve_name('_patchkit_autoload:run')()\nassert autoload._outcome is first\nprint('once')\n")
    done = subprocess.run([str(clean_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                          timeout=300, cwd=clean_venv, env={**_patchkit_free_environ(), "PATCHKIT_AUTOLOAD": "1"})
    assert done.returncode == 0 and done.stdout.strip() == "once", done.stderr


@pytest.mark.slow
def test_the_start_entry_point_imports_nothing_of_patchkit_when_autoload_is_unset(clean_venv):
    probe = ("import sys, pkgutil\npkgutil.resolve_name('_patchkit_autoload:run')()\n"
             "print(sorted(m for m in sys.modules if m.startswith('patchkit')))\n")
    done = subprocess.run([str(clean_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                          timeout=300, cwd=clean_venv, env=_patchkit_free_environ())
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr + done.stdout
