"""Test environments, one per upstream version set, generated from compat_matrix.yaml.

    nox -s demo          install the real upstreams, apply the patches, run `patchkit doctor` on them
    nox -t ci            the representative subset CI runs (entries marked `ci: true`)
    nox -l               every environment; `nox -s tests-<name>` runs one

Virtualenvs are made by uv on each environment's Python (`python:` in the matrix, default 3.11):
uv's cache hardlinks packages into each venv, so a dozen torch environments cost about one on disk.

After an environment's tests pass, `patchkit matrix record --env <name>` writes its versions and
fingerprints into compat_matrix.yaml. MATRIX_RECORD=write (the default) updates the file,
MATRIX_RECORD=check (the default when CI is set) fails if it is stale instead, MATRIX_RECORD=off skips.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import subprocess
import xml.etree.ElementTree as ET

import nox
import yaml

ROOT = pathlib.Path(__file__).parent
MATRIX = yaml.safe_load((ROOT / "compat_matrix.yaml").read_text())
REPORTS = ROOT / ".nox" / "reports"
RECORD = os.environ.get("MATRIX_RECORD", "check" if os.environ.get("CI") else "write")

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

# uv reads its own settings, not pip's: carry pip's local wheel folder over (this machine keeps the
# CPU build of torch there), and give multi-GB CUDA wheels time to download.
if os.environ.get("PIP_FIND_LINKS") and not os.environ.get("UV_FIND_LINKS"):
    os.environ["UV_FIND_LINKS"] = os.environ["PIP_FIND_LINKS"].replace(" ", ",")
os.environ.setdefault("UV_HTTP_TIMEOUT", "600")
DEFAULT_PYTHON = "3.11"


def _expose_pyenv_interpreters() -> None:
    """Let uv find every pyenv-installed CPython (python3.12, ...), not only the global one.

    pyenv's shims answer only for the versions it has selected; uv looks interpreters up on PATH by
    name. Selecting all installed 3.x versions, the current one first, keeps `python3` unchanged.
    """
    if not shutil.which("pyenv") or os.environ.get("PYENV_VERSION"):
        return
    run = functools.partial(subprocess.run, capture_output=True, text=True, check=False)
    current = run(["pyenv", "version-name"]).stdout.strip().split(":")
    installed = [v for v in run(["pyenv", "versions", "--bare"]).stdout.split() if v.startswith("3.")]
    if installed:
        os.environ["PYENV_VERSION"] = ":".join(dict.fromkeys([*current, *sorted(installed, reverse=True)]))


_expose_pyenv_interpreters()

#: The main job's upstreams: what a Megatron + ModelOpt trainer has installed today (Python 3.12).
DEMO_PYTHON = "3.12"
DEMO_INSTALL = [
    ["torch==2.11.0", "megatron-core==0.19.2", "nvidia-modelopt==0.47.0", "requests", "huggingface_hub"],
]


def _install_environment(session: nox.Session, env: dict) -> None:
    for step in env.get("install", []):
        session.install(*step)
    if env.get("uninstall"):
        session.run("uv", "pip", "uninstall", "-q", *env["uninstall"], external=True, silent=True)
    session.install("-e", ".", "pytest")


def _tests_session(name: str, env: dict):
    def run_tests(session: nox.Session) -> None:
        _install_environment(session, env)
        REPORTS.mkdir(parents=True, exist_ok=True)
        session.run("pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={REPORTS / name}.xml",
                    *env["tests"], *session.posargs, env={str(k): str(v) for k, v in env.get("env", {}).items()})
        if RECORD != "off" and not session.posargs:
            session.run("patchkit", "matrix", "record", "--env", name, *(["--check"] if RECORD == "check" else []))

    run_tests.__doc__ = env.get("description", f"tests against {name}")
    return run_tests


for _name, _env in MATRIX["environments"].items():
    nox.session(name=f"tests-{_name}", python=_env.get("python", DEFAULT_PYTHON),
                tags=["ci"] if _env.get("ci") else [])(_tests_session(_name, _env))


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy --strict over the engine."""
    session.install("ruff", "mypy", "types-PyYAML", "-e", ".")
    session.run("ruff", "check", "patchkit", "patches", "tests", "benchmarks", "noxfile.py")
    session.run("mypy")


@nox.session(tags=["ci"])
def matrix(session: nox.Session) -> None:
    """compat_matrix.yaml agrees with the patch registry, and the README table is generated from it."""
    session.install("-e", ".")
    session.run("patchkit", "matrix", "check")
    for document in ("README.md", "docs/compat-matrix.md"):
        if "<!-- compat-table:start -->" in (ROOT / document).read_text():
            session.run("patchkit", "matrix", "table", "--readme", document,
                        *(["--check"] if RECORD == "check" else []))
        else:
            session.warn(f"{document} has no compat-table markers: supported-versions table not generated")


@nox.session(tags=["ci"], venv_backend="none")
def summary(session: nox.Session) -> None:
    """Add up the junit reports of the environments that ran, as one closing line."""
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    for report in sorted(REPORTS.glob("*.xml")):
        for suite in ET.parse(report).getroot().iter("testsuite"):
            tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
            failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            totals["passed"] += tests - skipped - failed
            totals["failed"] += failed
            totals["skipped"] += skipped
            session.log(f"{report.stem}: {tests - skipped - failed} passed, {failed} failed, {skipped} skipped")
    # An environment that failed before pytest (an install error) leaves no report: that is a failure too.
    expected = [name for name, env in MATRIX["environments"].items() if env.get("ci")]
    missing = [name for name in expected if not (REPORTS / f"{name}.xml").exists()]
    totals["failed"] += len(missing)
    print(f"ci: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    if missing:
        session.error(f"no test report from {', '.join(missing)}: the environment failed before its tests")
    if totals["failed"] or not totals["passed"]:
        session.error("tests failed or none ran")


@nox.session(python=DEMO_PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: install patchkit with the real upstreams, apply every patch, prove each one here."""
    _install_environment(session, {"install": DEMO_INSTALL})
    session.run("patchkit", "status")
    session.run("patchkit", "doctor", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks in benchmarks/, each printing its ratios."""
    _install_environment(session, {"install": [["torch==2.13.0"]]})
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        session.run("python", str(script))
