"""Release artifacts of an upstream, downloaded once and unpacked to a cache, never installed.

``patchkit matrix static`` reads upstream sources from these trees with :mod:`ast`. Two ways in:

* a **wheel**, through ``pip download --only-binary :all:`` for a named Python version and
  platform (megatron-core ships small per-Python wheels; vLLM 0.15 ships no sdist at all);
* an **sdist**. ``pip download --no-binary :all:`` cannot fetch one without running the sdist's
  build backend to prepare its metadata, which for vLLM needs torch and CUDA and for megatron-core
  needs pybind11; so the sdist is taken from the index's own listing (the PEP 691 JSON page pip
  itself reads) and checked against the sha256 the index publishes.

Only ``.py`` files are kept; the archive is deleted after unpacking unless asked otherwise, so a
500 MB vLLM wheel leaves a few MB behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import PatchkitError

logger = logging.getLogger(__name__)

DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "patchkit" / "artifacts"


class ArtifactError(PatchkitError, RuntimeError):
    """A release artifact could not be found, downloaded or unpacked."""


class NoSdist(ArtifactError):
    """The release has no source distribution on the index."""


@dataclass(frozen=True)
class ArtifactSpec:
    """How to fetch one distribution's releases.

    ``kind``: ``sdist``, ``wheel``, or ``auto`` (the sdist, else a wheel for ``python_version`` on
    any of ``platforms``: vLLM 0.15 has no sdist and its wheel is manylinux_2_31).
    """

    distribution: str
    kind: str = "auto"
    python_version: str = "3.12"
    platforms: tuple[str, ...] = ("manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64")


@dataclass(frozen=True)
class SourceTree:
    """The unpacked Python sources of one release."""

    distribution: str
    version: str
    root: Path
    artifact: str

    def module_file(self, module: str) -> Path | None:
        """The file that defines ``module`` in this tree (``pkg/mod.py`` or ``pkg/mod/__init__.py``)."""
        relative = Path(*module.split("."))
        for root in (self.root, self.root / "src"):  # an sdist may keep its packages under src/ (Bridge)
            for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
                if candidate.is_file():
                    return candidate
        return None


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def fetch(spec: ArtifactSpec, version: str, cache: Path = DEFAULT_CACHE, keep_archive: bool = False,
          index: str = DEFAULT_INDEX) -> SourceTree:
    """The unpacked sources of ``spec.distribution==version``, downloading them on first use."""
    target = cache / _normalise(spec.distribution) / version
    done = target / ".complete"
    if done.is_file():
        return SourceTree(spec.distribution, version, target / "src", done.read_text().strip())
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        if spec.kind == "wheel":
            archive = _pip_wheel(spec, version, Path(scratch))
        else:
            try:
                archive = _index_sdist(spec.distribution, version, Path(scratch), index)
            except NoSdist:
                if spec.kind == "sdist":
                    raise
                archive = _pip_wheel(spec, version, Path(scratch))
        if target.exists():
            shutil.rmtree(target)
        (target / "src").mkdir(parents=True)
        _unpack_python(archive, target / "src")
        if keep_archive:
            shutil.copy2(archive, target / archive.name)
        done.write_text(archive.name + "\n")
    logger.info("patchkit: unpacked %s %s from %s", spec.distribution, version, archive.name)
    return SourceTree(spec.distribution, version, target / "src", archive.name)


def _pip_wheel(spec: ArtifactSpec, version: str, into: Path) -> Path:
    platforms = [arg for platform in spec.platforms for arg in ("--platform", platform)]
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
        "--python-version", spec.python_version, *platforms, "--dest", str(into), f"{spec.distribution}=={version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise ArtifactError(f"pip download of the {spec.distribution}=={version} wheel for Python "
                            f"{spec.python_version} on {', '.join(spec.platforms)} failed: "
                            f"{result.stderr.strip()[-500:]}")
    return Path(wheels[0])


def _index_sdist(distribution: str, version: str, into: Path, index: str) -> Path:
    url = f"{index.rstrip('/')}/{_normalise(distribution)}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            listing = json.load(response)
    except OSError as exc:
        raise ArtifactError(f"cannot read the index page {url}: {exc}") from exc
    stem = distribution.replace("-", "_").lower()
    wanted = {f"{stem}-{version}.tar.gz", f"{_normalise(distribution)}-{version}.tar.gz"}
    files = [f for f in listing.get("files", []) if f["filename"].lower() in wanted]
    if not files:
        sdists = sorted(f["filename"] for f in listing.get("files", []) if f["filename"].endswith(".tar.gz"))
        raise NoSdist(f"{distribution} {version} has no sdist on {url}; "
                            f"found {len(sdists)} sdists, e.g. {sdists[-3:]}; try the wheel (kind: wheel)")
    chosen = files[0]
    path: Path = into / str(chosen["filename"])
    digest = hashlib.sha256()
    with urllib.request.urlopen(chosen["url"], timeout=600) as response, path.open("wb") as out:
        for block in iter(lambda: response.read(1 << 20), b""):
            digest.update(block)
            out.write(block)
    expected = chosen.get("hashes", {}).get("sha256")
    if expected and digest.hexdigest() != expected:
        raise ArtifactError(f"{path.name}: sha256 {digest.hexdigest()} does not match the index's {expected}")
    return path


def _unpack_python(archive: Path, into: Path) -> None:
    """Extract only ``.py`` files; an sdist's top folder (``name-version/``) is dropped."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zipped:
            for name in zipped.namelist():
                if name.endswith(".py") and ".." not in Path(name).parts:
                    zipped.extract(name, into)
        return
    with tarfile.open(archive) as tarred:
        members = []
        for member in tarred.getmembers():
            parts = Path(member.name).parts
            if member.isfile() and member.name.endswith(".py") and ".." not in parts and len(parts) > 1:
                member.name = str(Path(*parts[1:]))
                members.append(member)
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+: refuse links and odd modes as well
            tarred.extractall(into, members=members, filter="data")
        else:  # pragma: no cover
            tarred.extractall(into, members=members)
