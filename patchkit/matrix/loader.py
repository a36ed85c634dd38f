"""Finding and loading ``compat_matrix.yaml``.

The repository root's ``compat_matrix.yaml`` is the file people and ``noxfile.py`` edit.
``patchkit/compat_matrix.yaml`` is a symlink to it, so the file is package data: in a source
checkout or an editable install it resolves to the root file; a wheel build copies its content
into the package (setuptools follows the link), so an installed patchkit carries the matrix it
was released with. Either way it is read through ``importlib.resources``.
"""

from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path

from .model import Matrix
from .schema import parse

FILENAME = "compat_matrix.yaml"


def default_path() -> Path | None:
    """The shipped matrix, or None if this installation has none."""
    try:
        candidate = resources.files("patchkit").joinpath(FILENAME)
    except (ModuleNotFoundError, TypeError):
        return None
    path = Path(str(candidate))
    return path if path.is_file() else None


@functools.lru_cache(maxsize=8)
def _load(path: str, size: int, mtime_ns: int) -> Matrix:
    return parse(Path(path).read_text(encoding="utf-8"), path)


def load(path: str | os.PathLike[str] | None = None) -> Matrix:
    """Read and validate a matrix (the shipped one by default); cached until the file changes.

    Raises ``MatrixError`` (with positions) if it is malformed, ``FileNotFoundError`` if absent.
    """
    chosen = Path(path) if path is not None else default_path()
    if chosen is None:
        raise FileNotFoundError(f"this patchkit installation ships no {FILENAME}")
    stat = chosen.stat()
    return _load(str(chosen), stat.st_size, stat.st_mtime_ns)
