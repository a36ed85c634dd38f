"""The on-disk fingerprint cache: parse an upstream file once per version of its content, not per process.

Fingerprinting a target parses its module's whole file: tens of milliseconds for megatron-core's
``gpt_model.py`` or ``router.py``, paid again by every rank of every job. The engine's drift check
therefore keeps what it computed in ``$XDG_CACHE_HOME/patchkit/`` (``~/.cache/patchkit``).

What the cache guarantees (docs/compat-matrix.md, "Fingerprint cache")
    * **It never makes drifted code look verified by mistake.** An entry is keyed by the sha256 of
      the file's *content* and the qualname, and its value was computed from exactly those bytes
      (:func:`patchkit.runtime.fingerprint.file_fingerprint` hashes and parses one read). No file
      identity (path, size, mtime, inode), which a shared home folder, a restored mtime or a reused
      inode can make collide, decides what an entry means. The file carries a sha256 of its payload:
      a torn, truncated or bit-flipped file is ignored as a whole, and a value that is not a
      fingerprint is ignored where it is looked up.
    * **Only the user writes it.** The folder is created ``0700``; a folder or file owned by
      another user, or writable by group or others, is not read (and the folder's group/other write
      bits are cleared before patchkit writes into it). Someone who can write as the user could
      still write a wrong entry, but could as well edit the upstream or patchkit: the cache adds no
      one who can lie to the drift check. Where that is not enough, ``PATCHKIT_FINGERPRINT_CACHE=off``
      turns the cache off (every process parses; a malformed value turns it off too).
    * **It never blocks or follows links.** Only a regular file is opened (``lstat`` first, then
      ``O_NONBLOCK | O_NOFOLLOW`` and ``fstat`` of what was opened), so a FIFO, a device or a symlink
      at the cache path is ignored, not opened. The new file is written to a fresh name created with
      ``O_CREAT | O_EXCL | O_NOFOLLOW`` (mode ``0600``) in the same folder and renamed into place: a
      symlink or anything else already at a temporary name is never written through, and concurrent
      ranks never read a torn file.
    * **Bounded cost.** A file over :data:`MAX_BYTES` is not read; at most :data:`LIMIT` entries
      (the newest) are kept, trimmed in one linear pass when the file is read and when it is written.
    * **No home, no cache.** With no absolute ``XDG_CACHE_HOME`` and no absolute home folder
      (``HOME`` unset and no passwd entry, in some containers) the cache is off: nothing is written
      relative to the working directory.

The format is ``marshal`` (built in: no import cost, unlike ``json``), one file per fingerprint
format and interpreter version, since ``marshal`` is not promised stable across Pythons. The cache
is an accelerator only: a missing, refused, unreadable, corrupt or unwritable file means "compute",
never an error.
"""

from __future__ import annotations

import hashlib
import logging
import marshal
import os
import stat
import sys
from typing import Any

logger = logging.getLogger(__name__)

#: Entries kept; each is one (file content, qualname). A few hundred targets exist in all.
LIMIT = 4096
#: A larger file is not read (LIMIT entries take about 0.6 MB): start-up cost stays bounded.
MAX_BYTES = 2 * 1024 * 1024
#: Returned by :func:`lookup` for a key not in the cache (None is a cached "no such symbol").
MISSING: Any = object()

_MAGIC = b"patchkit-fpcache-1\n"
_DIGEST = 32  # bytes of the payload's sha256 after the magic
_SCRATCH_TRIES = 8
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_entries: dict[tuple[str, str], str | None] | None = None
_dirty = False


class Refused(OSError):
    """The cache file or folder is not one patchkit may trust or write (the reason is the message)."""


def key(source: bytes, qualname: str) -> tuple[str, str]:
    """The cache key of ``qualname`` in a file whose content is ``source``."""
    return hashlib.sha256(source).hexdigest(), qualname


def path() -> str | None:
    """The cache file for this fingerprint format and interpreter; None where the cache is off."""
    from .fingerprint import FORMAT
    from .settings import fingerprint_cache_enabled

    if not fingerprint_cache_enabled():
        return None
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is invalid and ignored
        home = os.path.expanduser("~")  # "~" itself when HOME is unset and there is no passwd entry
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    tag = f"{sys.implementation.cache_tag or 'python'}"
    return os.path.join(base, "patchkit", f"fingerprints-{FORMAT}-{tag}.marshal")


def _load() -> dict[tuple[str, str], str | None]:
    global _entries
    if _entries is None:
        target = path()
        try:
            _entries = {} if target is None else _decode(_read_private(target))
        except FileNotFoundError:
            _entries = {}
        except Exception as exc:  # refused, unreadable or corrupt: start afresh, it is only a cache
            logger.debug("patchkit: fingerprint cache %s not used (%r); recomputing", target, exc)
            _entries = {}
    return _entries


def lookup(cache_key: tuple[str, str]) -> Any:
    """The cached fingerprint for ``cache_key`` (a str or None), or :data:`MISSING`."""
    from .fingerprint import LENGTH

    found = _load().get(cache_key, MISSING)
    if found is None or found is MISSING:
        return found
    if isinstance(found, str) and len(found) == LENGTH and all(c in "0123456789abcdef" for c in found):
        return found
    return MISSING  # not a fingerprint: recompute (and overwrite it)


def store(cache_key: tuple[str, str], value: str | None) -> None:
    global _dirty, _entries
    entries = _load()
    entries.pop(cache_key, None)
    entries[cache_key] = value
    if len(entries) > 2 * LIMIT:  # trimmed in batches: linear overall
        _entries = _newest(entries)
    _dirty = True


def flush() -> None:
    """Write the cache if anything was added; failures are logged at debug level and ignored."""
    global _dirty, _entries
    if not _dirty or _entries is None:
        return
    _dirty = False
    _entries = _newest(_entries)
    target = path()
    if target is None:
        return
    try:
        _write_private(target, _encode(_entries))
    except OSError as exc:
        logger.debug("patchkit: cannot write the fingerprint cache %s: %r", target, exc)


def clear() -> None:
    """Forget the in-memory copy (tests; a forked child re-reads the file)."""
    global _entries, _dirty
    _entries, _dirty = None, False


# --- the file ------------------------------------------------------------------------------------


def _newest(entries: dict[tuple[str, str], str | None]) -> dict[tuple[str, str], str | None]:
    """The last :data:`LIMIT` entries (insertion order is age), in one pass."""
    if len(entries) <= LIMIT:
        return entries
    items = list(entries.items())
    return dict(items[len(items) - LIMIT:])


def _encode(entries: dict[tuple[str, str], str | None]) -> bytes:
    payload = marshal.dumps(entries)
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def _decode(data: bytes) -> dict[tuple[str, str], str | None]:
    if not data.startswith(_MAGIC):
        raise ValueError("not a patchkit fingerprint cache (an older format?)")
    digest, payload = data[len(_MAGIC):len(_MAGIC) + _DIGEST], data[len(_MAGIC) + _DIGEST:]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("checksum mismatch (torn or corrupt file)")
    loaded = marshal.loads(payload)
    if not isinstance(loaded, dict):
        raise ValueError(f"payload is a {type(loaded).__name__}, not a dict")
    return _newest(loaded)


def _check_private(info: os.stat_result, what: str) -> None:
    """Refuse what another user owns or may write (POSIX; elsewhere there is nothing to check)."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:
        return
    if info.st_uid != geteuid():
        raise Refused(f"the cache {what} is owned by uid {info.st_uid}, not by this user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Refused(f"the cache {what} is writable by group or others (mode {stat.filemode(info.st_mode)})")


def _read_private(target: str) -> bytes:
    """The bytes of ``target`` if it is a regular file only this user can write; never blocks."""
    _check_private(os.stat(os.path.dirname(target)), "folder")
    before = os.lstat(target)
    if not stat.S_ISREG(before.st_mode):  # a FIFO, device, socket or symlink is never opened
        raise Refused(f"the cache path is not a regular file (mode {stat.filemode(before.st_mode)})")
    fd = os.open(target, os.O_RDONLY | _NONBLOCK | _NOFOLLOW | _CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
            raise Refused("the cache path was replaced while it was opened")
        _check_private(info, "file")
        if info.st_size > MAX_BYTES:
            raise Refused(f"the cache file has {info.st_size} bytes, over the {MAX_BYTES} read")
        chunks: list[bytes] = []
        left = MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise Refused(f"the cache file grew over the {MAX_BYTES} bytes read")
    return b"".join(chunks)


def _private_folder(folder: str) -> None:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    info = os.stat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise Refused("the cache folder is not a folder")
    if getattr(os, "geteuid", None) is not None and info.st_uid == os.geteuid() and info.st_mode & 0o022:
        os.chmod(folder, stat.S_IMODE(info.st_mode) & ~0o022)  # ours, made by an older patchkit: close it
        info = os.stat(folder)
    _check_private(info, "folder")


def _write_private(target: str, data: bytes) -> None:
    """Write ``data`` to a new private file next to ``target`` and rename it into place."""
    folder = os.path.dirname(target)
    _private_folder(folder)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    for _ in range(_SCRATCH_TRIES):
        scratch = _scratch_name(target)
        try:
            fd = os.open(scratch, flags, 0o600)
            break
        except FileExistsError:  # anything there (a symlink planted at a guessable name): not ours
            continue
    else:
        raise Refused(f"no fresh temporary name next to {target} after {_SCRATCH_TRIES} tries")
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(scratch, target)
    except BaseException:
        try:
            os.unlink(scratch)  # the name this call created, and only that
        except OSError:
            pass
        raise


def _scratch_name(target: str) -> str:
    return f"{target}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
