"""Finding the CPython each test environment needs, whatever started ``python3``.

nox (2026.10+) looks interpreters up through python-discovery, which reads pyenv shims through
``PYENV_VERSION``; pyenv's own ``python3`` shim exports ``PYENV_VERSION=<the global version>`` to
its child, so a nox started through the shim sees only that one version and then tries to download
the others. This module finds interpreters itself and hands nox absolute paths, so the answer does
not depend on how nox was started: a pyenv shim or not, ``PYENV_VERSION`` set or not, uv-managed
Pythons, a plain system Python.

Every candidate is *run* (``-c "import sys; ..."``): a shim or a broken link that cannot start the
version asked for is skipped, and the path returned is the real interpreter (``sys.executable``),
never a shim whose meaning changes with the environment. A candidate that does not answer within
:data:`PROBE_TIMEOUT` seconds (a shim waiting on a lock or the network) is skipped with a one-line
warning naming it, its process group killed; one whose answer is not a version and a path (non-UTF-8
bytes, an error message) is skipped. Standard library only: ``noxfile.py`` imports it before any
environment exists.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

_PROBE = "import sys; print('%d.%d' % sys.version_info[:2]); print(sys.executable)"
_RELEASE_DIR = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_VERSION = re.compile(r"^\d+\.\d+$")
#: Seconds a candidate has to answer the probe: CPython answers in well under one, even on a loaded
#: machine; a shim that hangs must not hold every nox start up for long.
PROBE_TIMEOUT = 5.0

logger = logging.getLogger(__name__)


def find_python(version: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The first working CPython ``version`` ("3.12") found, as an absolute path, or None.

    Looked for, in order: ``pythonX.Y`` on ``PATH`` (pyenv shims included, but only if they start
    that version as they are), pyenv's installed versions (``$PYENV_ROOT/versions/X.Y.*``, newest
    first, whatever ``PYENV_VERSION`` selects), uv-managed Pythons (``uv python dir``), and the
    usual system locations.
    """
    environ = os.environ if environ is None else environ
    for candidate in _candidates(version, environ):
        found = _probe(candidate, environ)
        if found is not None and found[0] == version:
            return found[1]
    return None


def missing_message(version: str, needed_by: str) -> str:
    """One line saying which Python is missing, who needs it and how to get it."""
    return (f"Python {version} is needed by {needed_by} and was not found (looked on PATH, in pyenv's versions, "
            f"among uv-managed Pythons and in /usr/bin, /usr/local/bin): install it with "
            f"`pyenv install {version}` or `uv python install {version}`, then run nox again")


def _candidates(version: str, environ: Mapping[str, str]) -> Iterator[Path]:
    name = f"python{version}"
    for folder in environ.get("PATH", "").split(os.pathsep):
        if folder:
            yield Path(folder) / name
    yield from _pyenv_candidates(version, environ)
    yield from _uv_candidates(version, environ)
    for folder in ("/usr/local/bin", "/usr/bin"):
        yield Path(folder) / name


def _pyenv_candidates(version: str, environ: Mapping[str, str]) -> Iterator[Path]:
    root = environ.get("PYENV_ROOT") or (str(Path(environ["HOME"]) / ".pyenv") if environ.get("HOME") else "")
    versions = Path(root) / "versions" if root else None
    if versions is None or not versions.is_dir():
        return
    major, minor = (int(part) for part in version.split("."))
    releases = []
    for entry in versions.iterdir():
        match = _RELEASE_DIR.match(entry.name)
        if match and (int(match[1]), int(match[2])) == (major, minor):
            releases.append((int(match[3]), entry))
    for _, entry in sorted(releases, reverse=True):
        yield entry / "bin" / f"python{version}"


def _uv_candidates(version: str, environ: Mapping[str, str]) -> Iterator[Path]:
    """uv's managed installs (``uv python install``), found in uv's folder without asking uv to resolve."""
    folders = []
    if environ.get("UV_PYTHON_INSTALL_DIR"):
        folders.append(Path(environ["UV_PYTHON_INSTALL_DIR"]))
    data_home = environ.get("XDG_DATA_HOME") or (str(Path(environ["HOME"]) / ".local" / "share")
                                                 if environ.get("HOME") else "")
    if data_home:
        folders.append(Path(data_home) / "uv" / "python")
    uv = shutil.which("uv", path=environ.get("PATH"))
    if uv:
        answer = _run([uv, "python", "dir"], environ)
        if answer:
            folders.append(Path(answer.strip()))
    for folder in dict.fromkeys(folders):
        if folder.is_dir():
            for entry in sorted(folder.glob(f"cpython-{version}.*"), reverse=True):
                yield entry / "bin" / f"python{version}"


def _probe(candidate: Path, environ: Mapping[str, str]) -> tuple[str, Path] | None:
    if not (candidate.is_file() and os.access(candidate, os.X_OK)):
        return None
    answer = _run([str(candidate), "-c", _PROBE], environ)
    if answer is None:
        return None
    lines = answer.splitlines()  # the path may hold spaces: one answer per line
    if len(lines) != 2 or not _VERSION.match(lines[0]) or not os.path.isabs(lines[1]):
        return None
    return lines[0], Path(lines[1])


def _run(command: list[str], environ: Mapping[str, str]) -> str | None:
    """What ``command`` printed (bytes that are not UTF-8 kept as the file system would name them),
    or None when it failed, could not start, or did not answer within :data:`PROBE_TIMEOUT` seconds."""
    timeout = PROBE_TIMEOUT
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, env=dict(environ), start_new_session=True)
    except (OSError, ValueError):
        return None
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Its own session: a shell script's children (the process that actually hangs) are killed too.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            process.kill()
        process.communicate()
        logger.warning("devtools: skipped %s: it did not answer `%s -c ...` within %g s (a hanging shim?)",
                       command[0], os.path.basename(command[0]), timeout)
        return None
    if process.returncode != 0:
        return None
    return os.fsdecode(output)
