"""Installed distributions' versions, read from their metadata files without ``importlib.metadata``.

``importlib.metadata`` costs about 30 ms to import (it pulls in ``email``, ``zipfile``, ``csv``
and more) for what is, on an ordinary ``sys.path``, a directory listing and one header line. This
module reads that line the way ``importlib.metadata.version`` finds it, and hands over to
``importlib.metadata`` itself wherever the ordinary case does not hold:

* ``sys.path`` entries are searched in order; in each, ``<name>-*.dist-info`` and
  ``<name>-*.egg-info`` entries are matched with ``importlib.metadata``'s name normalisation
  (runs of ``-_.`` equal, case ignored), ``.dist-info``/``.egg-info`` directories in listing order,
  then an ``EGG-INFO`` inside an ``.egg`` path entry. The first match wins, as there.
* ``METADATA`` (dist-info), ``PKG-INFO`` (egg-info directory) or the egg-info file itself holds
  RFC 822 headers; the first ``Version:`` header before the blank line is the version. Editable
  installs are covered: PEP 660 ones leave a dist-info in site-packages, ``setup.py develop`` ones
  an egg-info beside the source that ``sys.path`` points at.
* **Fallback to importlib.metadata** when a ``sys.path`` entry is a file (a zip or wheel on the
  path), when a finder on ``sys.meta_path`` other than the standard ``PathFinder`` offers
  ``find_distributions`` (it may know distributions no directory shows), or when a matched entry
  cannot be read as expected.

``tests/engine/test_distinfo.py`` checks the answers against ``importlib.metadata`` for each case.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Callable

#: Every separator ``importlib.metadata`` treats alike, made ``_`` (string methods: no `re` at start-up).
_SEPARATORS = str.maketrans("-.", "__")
_listings: dict[str, tuple[int, dict[str, list[str]]]] = {}
#: Versions read from metadata entries, by entry path; an entry's folder listing changing (an install
#: or an upgrade renames the entry) drops that folder's (see :func:`_listing`). A process asks about
#: the same few distributions at every decision and drift check: each answer is a file read.
_versions: dict[str, str | None] = {}


class _Unsure(Exception):
    """The fast path cannot answer exactly as importlib.metadata would."""


def normalise(name: str) -> str:
    """``importlib.metadata``'s ``Prepared.normalize``: ``Foo.Bar-baz`` -> ``foo_bar_baz``."""
    folded = name.translate(_SEPARATORS).lower()
    while "__" in folded:  # a run of separators is one
        folded = folded.replace("__", "_")
    return folded


def _listing(entry: str) -> dict[str, list[str]]:
    """Metadata entries of one sys.path folder by normalised name, cached until the folder changes."""
    folder = entry or "."
    mtime = os.stat(folder).st_mtime_ns
    cached = _listings.get(folder)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    if cached is not None:
        prefix = os.path.join(folder, "")
        for path in [path for path in _versions if path.startswith(prefix)]:
            del _versions[path]
    found: dict[str, list[str]] = {}
    for child in os.listdir(folder):
        low = child.lower()
        if low.endswith((".dist-info", ".egg-info")):
            found.setdefault(normalise(low.rpartition(".")[0].partition("-")[0]), []).append(child)
    _listings[folder] = (mtime, found)
    return found


def _header_version(path: str) -> str | None:
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        for line in handle:
            if not line.strip():
                return None  # end of the headers
            key, sep, value = line.partition(":")
            if sep and key.strip().lower() == "version" and not line[0].isspace():
                return value.strip()
    return None


def _read(info: str) -> str | None:
    if os.path.isdir(info):
        for name in ("METADATA", "PKG-INFO"):
            candidate = os.path.join(info, name)
            if os.path.isfile(candidate):
                return _header_version(candidate)
        raise _Unsure(f"{info} has no METADATA or PKG-INFO")
    if os.path.isfile(info):  # an egg-info file: the PKG-INFO text itself
        return _header_version(info)
    raise _Unsure(f"{info} is neither a file nor a folder")


def _fast(distribution: str) -> str | None:
    for finder in sys.meta_path:
        if hasattr(finder, "find_distributions") and finder is not PathFinder:
            raise _Unsure(f"{finder!r} may provide distributions")
    wanted = normalise(distribution)
    legacy = distribution.lower().replace("-", "_")
    for raw in sys.path:
        entry = os.fspath(raw) if isinstance(raw, (str, os.PathLike)) else None
        if entry is None:
            continue
        folder = entry or "."
        if not os.path.isdir(folder):
            if os.path.exists(folder):
                raise _Unsure(f"{folder} on sys.path is a file (a zip?)")
            continue
        for child in _listing(entry).get(wanted, ()):
            info = os.path.join(folder, child)
            if info not in _versions:
                _versions[info] = _read(info)
            return _versions[info]
        base = os.path.basename(folder.rstrip(os.sep)).lower()
        if base.endswith(".egg") and base.rpartition(".")[0].partition("-")[0] == legacy:
            info = os.path.join(folder, "EGG-INFO")
            if os.path.exists(info):
                return _read(info)
    return None


def _slow(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def version(distribution: str, fallback: Callable[[str], str | None] = _slow) -> str | None:
    """The installed version of ``distribution`` as its metadata spells it, or None if not installed."""
    try:
        return _fast(distribution)
    except (_Unsure, OSError, UnicodeDecodeError):
        return fallback(distribution)
