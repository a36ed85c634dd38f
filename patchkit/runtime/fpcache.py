"""The on-disk fingerprint cache: parse an upstream file once per installed version, not per process.

Fingerprinting a target parses its module's whole file: tens of milliseconds for megatron-core's
``gpt_model.py`` or ``router.py``, paid again by every rank of every job. The engine's drift check
therefore keeps what it computed in ``$XDG_CACHE_HOME/patchkit/`` (``~/.cache/patchkit``), keyed by
the file's identity (path, size, mtime, ctime, inode: see :func:`patchkit.runtime.fingerprint.identity`)
and the qualname. Any rewrite of the file changes its ctime, so a stale entry is never found; it
only ages out (the file keeps the newest :data:`LIMIT` entries).

The format is ``marshal`` (built in: no import cost, unlike ``json``), one file per fingerprint
format and interpreter version, since ``marshal`` is not promised stable across Pythons. The cache
is an accelerator only: a missing, unreadable, corrupt or unwritable file means "compute", never an
error; writes go to a temporary file renamed into place, so concurrent ranks never read a torn file.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import sys
from typing import Any

logger = logging.getLogger(__name__)

#: Entries kept; each is one (file version, qualname). A few hundred targets exist in all.
LIMIT = 4096
#: Returned by :func:`lookup` for a key not in the cache (None is a cached "no such symbol").
MISSING: Any = object()

_entries: dict[tuple[Any, ...], str | None] | None = None
_dirty = False


def path() -> str:
    """The cache file for this fingerprint format and interpreter."""
    from .fingerprint import FORMAT

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = f"{sys.implementation.cache_tag or 'python'}"
    return os.path.join(base, "patchkit", f"fingerprints-{FORMAT}-{tag}.marshal")


def _load() -> dict[tuple[Any, ...], str | None]:
    global _entries
    if _entries is None:
        try:
            with open(path(), "rb") as handle:
                loaded = marshal.load(handle)
            _entries = {tuple(k): v for k, v in loaded.items()} if isinstance(loaded, dict) else {}
        except FileNotFoundError:
            _entries = {}
        except Exception as exc:  # unreadable or corrupt: start afresh, it is only a cache
            logger.debug("patchkit: fingerprint cache %s unreadable (%r); recomputing", path(), exc)
            _entries = {}
    return _entries


def lookup(key: tuple[Any, ...]) -> Any:
    """The cached fingerprint for ``key`` (a str or None), or :data:`MISSING`."""
    return _load().get(key, MISSING)


def store(key: tuple[Any, ...], value: str | None) -> None:
    global _dirty
    entries = _load()
    entries.pop(key, None)
    entries[key] = value
    while len(entries) > LIMIT:
        del entries[next(iter(entries))]
    _dirty = True


def flush() -> None:
    """Write the cache if anything was added; failures are logged at debug level and ignored."""
    global _dirty
    if not _dirty or _entries is None:
        return
    _dirty = False
    target = path()
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        scratch = f"{target}.{os.getpid()}.tmp"  # one writer per process: the pid makes the name unique
        try:
            with open(scratch, "wb") as out:
                marshal.dump(dict(_entries), out)
            os.replace(scratch, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(scratch)
            raise
    except OSError as exc:
        logger.debug("patchkit: cannot write the fingerprint cache %s: %r", target, exc)


def clear() -> None:
    """Forget the in-memory copy (tests; a forked child re-reads the file)."""
    global _entries, _dirty
    _entries, _dirty = None, False
