"""Test environments, one per upstream version set, generated from compat_matrix.yaml.

    nox -s demo          install the real upstreams, apply the patches, run `patchkit doctor` on them
    nox -s docs          regenerate the README's catalogue table and the compatibility grid
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
import sys
import tempfile
import xml.etree.ElementTree as ET

import nox
import yaml

ROOT = pathlib.Path(__file__).parent
sys.path.insert(0, str(ROOT))
from devtools import interpreters, locks, pytest_targets  # noqa: E402  (the repository's own nox helpers)

MATRIX = yaml.safe_load((ROOT / "compat_matrix.yaml").read_text())
REPORTS = ROOT / os.environ.get("PATCHKIT_REPORTS", ".nox/reports")
RECORD = os.environ.get("MATRIX_RECORD", "check" if os.environ.get("CI") else "write")

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

# uv reads its own settings, not pip's: carry pip's local wheel folder over (this machine keeps the
# CPU build of torch there), and give multi-GB CUDA wheels time to download.
if os.environ.get("PIP_FIND_LINKS") and not os.environ.get("UV_FIND_LINKS"):
    os.environ["UV_FIND_LINKS"] = os.environ["PIP_FIND_LINKS"].replace(" ", ",")
os.environ.setdefault("UV_HTTP_TIMEOUT", "600")
# Interpreters are found by devtools.interpreters and handed to uv as paths: never downloaded.
os.environ["UV_PYTHON_DOWNLOADS"] = "never"
DEFAULT_PYTHON = "3.11"
#: The canary (`nox -s canary`) sets this: install the newest releases, ignoring constraints/.
UNPINNED = os.environ.get("PATCHKIT_UNPINNED") == "1"
CONSTRAINTS = ROOT / "constraints"
#: The most pytest-xdist workers a test session starts unless WORKERS_VARIABLE says otherwise.
MAX_TEST_WORKERS = 4
WORKERS_VARIABLE = "PYTEST_XDIST_AUTO_NUM_WORKERS"

#: The main job's upstreams: what a Megatron + ModelOpt + Megatron-Bridge trainer has installed today
#: (Python 3.12), as the export-bridge-0.6 environment of compat_matrix.yaml installs them. Bridge goes
#: in without its dependencies (it pins a megatron-core of its own); what it imports comes first
#: (datasets, tensorboard and megatron-energon: what its training utilities import, which the
#: doctor's check of bridge.value_model_helpers imports).
DEMO_PYTHON = "3.12"
DEMO_INSTALL = [
    ["torch==2.11.0", "megatron-core==0.19.2", "nvidia-modelopt==0.47.0", "requests", "huggingface_hub",
     "transformers>=5.8,<=5.12.1", "einops", "omegaconf", "pyyaml", "tqdm", "rich", "regex", "six", "numpy<2.5",
     "torch_memory_saver==0.0.10", "datasets", "tensorboard", "megatron-energon"],
    ["--no-deps", "megatron-bridge==0.6.2"],
]
#: The opt-in patches the main job demonstrates, switched on for `status` as a user would switch them on.
DEMO_OPT_INS = ["megatron.mtp_postprocess", "modelopt.nvfp4_cpu_fake_quant"]


@functools.cache
def _interpreter(version: str) -> str | None:
    found = interpreters.find_python(version)
    return str(found) if found else None


def _session(name: str, python: str | None, needed_by: str, **options):
    """``nox.session`` on the interpreter ``python`` names, or a session that says it is missing."""
    if python is None:
        return nox.session(name=name, **options)
    path = _interpreter(python)
    if path is not None:
        return nox.session(name=name, python=path, **options)

    def register(function):
        def missing(session: nox.Session) -> None:
            session.error(interpreters.missing_message(python, needed_by))

        missing.__doc__ = function.__doc__
        return nox.session(name=name, venv_backend="none", **options)(missing)

    return register


#: Every session that installs packages: its Python and its install steps (one `uv pip install` each).
#: Each has a lock, constraints/<session>.txt, made by `nox -s lock`.
INSTALLS: dict[str, tuple[str, list[list[str]]]] = {
    f"tests-{name}": (env.get("python", DEFAULT_PYTHON), env.get("install", []))
    for name, env in MATRIX["environments"].items()
}
INSTALLS["demo"] = (DEMO_PYTHON, DEMO_INSTALL)
INSTALLS["lint"] = (DEFAULT_PYTHON, [["ruff", "mypy", "types-PyYAML"]])
INSTALLS["matrix"] = (DEFAULT_PYTHON, [])
INSTALLS["docs"] = (DEFAULT_PYTHON, [])
INSTALLS["bench"] = (DEFAULT_PYTHON, [["torch==2.13.0"]])


def _lock_inputs(name: str) -> locks.LockInputs:
    python, steps = INSTALLS[name]
    return locks.inputs_for(python, steps, ROOT)


def _install(session: nox.Session, uninstall: list[str] = ()) -> None:
    """Install the session's steps, then patchkit (editable, with the matrix tooling) and pytest, under the lock."""
    name = session.name
    _, steps = INSTALLS[name]
    constraint: list[str] = []
    if not UNPINNED:
        lock = CONSTRAINTS / f"{name}.txt"
        try:
            locks.check(lock, _lock_inputs(name), name)
        except locks.StaleLockError as exc:
            session.error(str(exc))
        constraint = ["--constraint", str(lock)]
    for step in steps:
        session.install(*step, *constraint)
    # A reused environment made before the distribution was named patchkit-rl still holds the metadata
    # and entry points of `patchkit` (the same import package): removed, so each entry point is there once.
    session.run("uv", "pip", "uninstall", "-q", "patchkit", *uninstall, external=True, silent=True)
    session.install("-e", ".[matrix]", "pytest", "pytest-xdist", *constraint)


def _test_workers() -> int:
    """How many pytest-xdist workers a test session starts: one per usable core, at most MAX_TEST_WORKERS.

    At most MAX_TEST_WORKERS by default: every worker imports torch and its upstream (1-3 GB each).
    pytest-xdist's own ``PYTEST_XDIST_AUTO_NUM_WORKERS`` sets the number instead. Not a ``PATCHKIT_*``
    name: patchkit reads every variable of its prefix as a setting, and doctor reports an unknown one.
    """
    configured = os.environ.get(WORKERS_VARIABLE, "").strip()
    if not configured:
        return max(1, min(len(os.sched_getaffinity(0)), MAX_TEST_WORKERS))
    if not configured.isdigit():
        raise SystemExit(f"{WORKERS_VARIABLE}={configured!r}: expected a number of test workers (0 for one process)")
    return int(configured)


def _tests_session(name: str, env: dict):
    def run_tests(session: nox.Session) -> None:
        _install(session, env.get("uninstall", []))
        REPORTS.mkdir(parents=True, exist_ok=True)
        targets = pytest_targets.pytest_targets(env["tests"], session.posargs, ROOT)
        # Test files are shared out between workers whole (`loadfile`): a file's tests run in one process, in
        # order, as they do serially. `-- -n 0` on the command line runs the session in one process.
        session.run("pytest", "-q", "-p", "no:cacheprovider", f"--numprocesses={_test_workers()}",
                    "--dist=loadfile", f"--junitxml={REPORTS / name}.xml", *targets,
                    env={str(k): str(v) for k, v in env.get("env", {}).items()})
        if RECORD != "off" and not session.posargs:
            session.run("patchkit", "matrix", "record", "--env", name, *(["--check"] if RECORD == "check" else []))

    run_tests.__doc__ = env.get("description", f"tests against {name}")
    return run_tests


for _name, _env in MATRIX["environments"].items():
    _session(f"tests-{_name}", _env.get("python", DEFAULT_PYTHON), f"environment {_name} (compat_matrix.yaml)",
             tags=["ci"] if _env.get("ci") else [])(_tests_session(_name, _env))


@_session("lint", DEFAULT_PYTHON, "the lint session", tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy --strict over the engine."""
    _install(session)
    session.run("ruff", "check", "patchkit", "patches", "tests", "benchmarks", "devtools", "noxfile.py")
    session.run("mypy")


@_session("matrix", DEFAULT_PYTHON, "the matrix session", tags=["ci"])
def matrix(session: nox.Session) -> None:
    """compat_matrix.yaml agrees with the patch registry, and the documents generated from it are current."""
    _install(session)
    session.run("patchkit", "matrix", "check")
    _generate_documents(session, check=RECORD == "check")


def _generate_documents(session: nox.Session, check: bool) -> None:
    """The catalogue table and its summary in the README, the supported-versions table and the compatibility grid."""
    flag = ["--check"] if check else []
    for document in ("README.md", "docs/catalogue.md", "docs/compat-matrix.md"):
        session.run("patchkit", "matrix", "table", "--readme", document, *flag)
    session.run("patchkit", "matrix", "grid", "--markdown", "docs/compatibility.md",
                "--html", "docs/compatibility.html", *flag)


@_session("docs", DEFAULT_PYTHON, "the docs session")
def docs(session: nox.Session) -> None:
    """Regenerate the README's catalogue table, the supported-versions table and the compatibility grid."""
    _install(session)
    _generate_documents(session, check=False)


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


@_session("demo", DEMO_PYTHON, "the main job (nox -s demo)")
def demo(session: nox.Session) -> None:
    """The main job: install patchkit with the real upstreams, apply every patch, prove each one here."""
    _install(session)
    opt_in = {"PATCHKIT_OPT_IN": ",".join(DEMO_OPT_INS)}
    # `patchkit status` / `patchkit doctor`, with Bridge imported under the TransformerEngine import
    # stand-in first (TE needs CUDA to install; tests/demo_stack.py says why that is sound).
    session.run("python", "tests/demo_stack.py", "status", env=opt_in)
    session.run("python", "tests/demo_stack.py", "doctor", *session.posargs, env=opt_in)


@_session("bench", DEFAULT_PYTHON, "the benchmarks (nox -s bench)")
def bench(session: nox.Session) -> None:
    """The benchmarks in benchmarks/, each printing its ratios."""
    _install(session)
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        session.run("python", str(script))


@nox.session(venv_backend="none")
def lock(session: nox.Session) -> None:
    """(Re)make constraints/<session>.txt for the sessions named (default: every one) with `uv pip compile`."""
    from uv import find_uv_bin

    names = list(session.posargs) or ["tools", *sorted(INSTALLS)]
    unknown = sorted(set(names) - set(INSTALLS) - {"tools"})
    if unknown:
        session.error(f"no session installs packages as {', '.join(unknown)}; known: {', '.join(INSTALLS)}")
    CONSTRAINTS.mkdir(exist_ok=True)
    # Resolve against the package index alone, so the lock is the same on every machine.
    environ = {key: value for key, value in os.environ.items() if key not in ("UV_FIND_LINKS", "UV_CONSTRAINT")}

    def compile_hashed(what: str, *arguments: str, previous: pathlib.Path | None = None) -> str:
        """`uv pip compile` with hashes and without comments; the session fails with uv's message.

        With ``previous`` (the lock as committed), uv keeps the versions it pins wherever the requirements
        still allow them: adding one requirement adds it and what it needs, and upgrades nothing else.
        """
        with tempfile.TemporaryDirectory() as scratch:
            output = pathlib.Path(scratch) / "compiled.txt"
            if previous is not None and previous.is_file():
                shutil.copyfile(previous, output)  # uv prefers the pins of an existing output file
            done = subprocess.run([find_uv_bin(), "pip", "compile", "--quiet", "--no-header", "--no-annotate",
                                   "--generate-hashes", "--output-file", str(output), *arguments],
                                  capture_output=True, text=True, env=environ, check=False)
            if done.returncode != 0:
                session.error(f"uv pip compile failed for {what}:\n{done.stderr}")
            return output.read_text()

    if "tools" in names:
        names.remove("tools")
        session.log("lock tools: devtools/tools.txt, every Python from 3.10")
        compiled = compile_hashed("devtools/tools.in", "--universal", "--python-version", "3.10",
                                  str(ROOT / "devtools" / "tools.in"))
        (ROOT / "devtools" / "tools.txt").write_text(
            "# The README commands' tools, compiled from devtools/tools.in by `python3 -m nox -s lock -- tools`.\n"
            + compiled)
    for name in names:
        inputs = _lock_inputs(name)
        session.log(f"lock {name}: Python {inputs.python}, {len(inputs.requirements)} requirements")
        with tempfile.TemporaryDirectory() as scratch:
            requirements = pathlib.Path(scratch) / "requirements.in"
            requirements.write_text("\n".join(inputs.requirements) + "\n")
            compiled = compile_hashed(name, "--python-version", inputs.python, "--python-platform",
                                      "x86_64-manylinux_2_28",
                                      *(arg for path in inputs.overrides for arg in ("--override", str(ROOT / path))),
                                      str(requirements), previous=CONSTRAINTS / f"{name}.txt")
        (CONSTRAINTS / f"{name}.txt").write_text(locks.render(name, inputs, compiled))


@nox.session(python=False)
def canary(session: nox.Session) -> None:
    """The CI subset with today's newest nox, uv and dependencies (constraints ignored): drift seen early.

    Runs in a separate .nox-canary folder with its own tool venv, so it never touches CI's
    environments. Not part of `nox -t ci`; the scheduled workflow .github/workflows/canary.yml runs it.
    """
    canary_dir = ROOT / ".nox-canary"
    tools = canary_dir / "tools"
    shutil.rmtree(canary_dir / "reports", ignore_errors=True)
    if not (tools / "bin" / "python").exists():
        session.run(sys.executable, "-m", "venv", str(tools))
    session.run(str(tools / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "nox", "uv", "PyYAML")
    session.run(str(tools / "bin" / "python"), "-m", "nox", "--envdir", str(canary_dir / "envs"),
                "-t", "ci", env={"PATCHKIT_UNPINNED": "1", "MATRIX_RECORD": "off",
                                  "PATCHKIT_REPORTS": str(canary_dir / "reports")})
