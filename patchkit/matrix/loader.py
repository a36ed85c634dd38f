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

from .model import Matrix, Position
from .schema import MatrixError, Problem, parse

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
    return parse(decode(Path(path).read_bytes(), path), path)


def decode(data: bytes, path: str) -> str:
    """The file's text (UTF-8, as YAML 1.2 requires); ``MatrixError`` at the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start].decode("utf-8", errors="replace")
        position = Position(path, before.count("\n") + 1, len(before) - before.rfind("\n"))
        raise MatrixError(path, [Problem(position, "the file", "UTF-8 text",
                                         f"the byte {data[exc.start:exc.start + 1]!r}")]) from None


def _unreadable(path: str, found: str) -> MatrixError:
    return MatrixError(path, [Problem(Position(path, 1, 1), "the file", "a readable YAML file", found)])


def load(path: str | os.PathLike[str] | None = None) -> Matrix:
    """Read and validate a matrix (the shipped one by default); cached until the file changes.

    Raises ``MatrixError`` (with positions) if it is malformed, missing, a folder or unreadable;
    ``FileNotFoundError`` only when no path is given and this installation ships no matrix.
    """
    chosen = Path(path) if path is not None else default_path()
    if chosen is None:
        raise FileNotFoundError(f"this patchkit installation ships no {FILENAME}")
    shown = str(chosen)
    try:
        stat = chosen.stat()
        if chosen.is_dir():
            raise _unreadable(shown, "a directory")
        return _load(shown, stat.st_size, stat.st_mtime_ns)
    except FileNotFoundError:
        raise _unreadable(shown, "no such file") from None
    except OSError as exc:
        raise _unreadable(shown, exc.strerror or repr(exc)) from None
