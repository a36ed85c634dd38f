"""The on-disk fingerprint cache cannot hide drift, stall start-up, hang, litter or write through links.

Each test drives the real cache through ``fingerprint.file_fingerprint(..., persist=True)`` and
``fpcache.flush()``, the calls the engine's drift check makes, with the cache folder in a temp
folder (``XDG_CACHE_HOME``).
"""

from __future__ import annotations

import marshal
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from patchkit.runtime import fingerprint, fpcache

ORIGINAL = "def target(x):\n    return x + 1\n"
DRIFTED = "def target(x):\n    return x + 2\n"  # same size: only the content tells them apart


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "cache"
    (home / "patchkit").mkdir(parents=True, mode=0o700)
    os.chmod(home / "patchkit", 0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.delenv("PATCHKIT_FINGERPRINT_CACHE", raising=False)
    fpcache.clear()
    yield home
    fpcache.clear()


def source_file(tmp_path: Path, text: str = ORIGINAL) -> Path:
    path = tmp_path / "upstream_module.py"
    path.write_text(text)
    return path


def cached(path: Path) -> str | None:
    found = fingerprint.file_fingerprint(path, ["target"], persist=True)
    fpcache.flush()
    return found


def truth(text: str) -> str:
    found = fingerprint.source_fingerprint(text, ["target"])
    assert found is not None
    return found


def test_an_entry_filed_under_the_files_identity_is_never_trusted(tmp_path: Path, cache_home: Path) -> None:
    """A well-formed entry for the drifted file's identity (path, size, mtime, ctime, inode) saying
    "the original code": what a shared home or a reused inode gives. Before, it hid the drift."""
    path = source_file(tmp_path, DRIFTED)
    info = os.stat(path)
    poisoned = {(str(path), info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, "target"): truth(ORIGINAL)}
    target = fpcache.path()
    assert target is not None
    Path(target).write_bytes(marshal.dumps(poisoned))
    os.chmod(target, 0o600)
    fpcache.clear()
    assert cached(path) == truth(DRIFTED)


def test_a_torn_or_edited_cache_file_is_ignored_as_a_whole(tmp_path: Path, cache_home: Path) -> None:
    path = source_file(tmp_path, DRIFTED)
    cached(path)
    target = Path(fpcache.path() or "")
    data = bytearray(target.read_bytes())
    spot = data.rfind(truth(DRIFTED).encode())
    assert spot > 0
    data[spot:spot + 16] = truth(ORIGINAL).encode()  # the original's fingerprint, well-formed
    target.write_bytes(bytes(data))
    fpcache.clear()
    assert cached(path) == truth(DRIFTED)


def test_a_value_that_is_not_a_fingerprint_is_recomputed(tmp_path: Path, cache_home: Path) -> None:
    """A None-like or foreign value would read as "no readable source": unknown, never drifted."""
    path = source_file(tmp_path, DRIFTED)
    for poison in (12345, "", "not-a-fingerprint", b"0123456789abcdef"):
        cached(path)
        target = Path(fpcache.path() or "")
        entries = fpcache._decode(target.read_bytes())
        entries = {k: poison for k in entries}
        target.write_bytes(fpcache._encode(entries))  # type: ignore[arg-type]
        fpcache.clear()
        assert cached(path) == truth(DRIFTED), poison


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_cache_others_may_write_is_not_read(tmp_path: Path, cache_home: Path, what: str) -> None:
    path = source_file(tmp_path, DRIFTED)
    cached(path)
    target = Path(fpcache.path() or "")
    key = fpcache.key(DRIFTED.encode(), "target")
    target.write_bytes(fpcache._encode({key: truth(ORIGINAL)}))  # a valid file lying about the content
    os.chmod(target if what == "file" else target.parent, 0o666 if what == "file" else 0o777)
    fpcache.clear()
    assert cached(path) == truth(DRIFTED)
    if what == "folder":  # patchkit closed its own folder again before writing into it
        assert stat.S_IMODE(os.stat(target.parent).st_mode) & 0o022 == 0


def test_a_huge_cache_costs_start_up_no_more_than_a_bounded_read(tmp_path: Path, cache_home: Path) -> None:
    """200k entries: before, trimming them one by one from the front of a dict took 11 s."""
    entries = {(f"{i:064x}", f"q{i}"): f"{i:016x}" for i in range(200_000)}
    target = Path(fpcache.path() or "")
    encode = getattr(fpcache, "_encode", marshal.dumps)
    if encode is marshal.dumps:  # the old format: keys were file identities
        entries = {(f"/x/{i}.py", i, i, i, i, f"q{i}"): f"{i:016x}" for i in range(200_000)}  # type: ignore[misc]
    target.write_bytes(encode(entries))
    os.chmod(target, 0o600)
    path = source_file(tmp_path)
    fpcache.clear()
    start = time.perf_counter()
    assert cached(path) == truth(ORIGINAL)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert len(fpcache._load()) <= fpcache.LIMIT


def test_trimming_keeps_the_newest_entries_in_one_pass(tmp_path: Path, cache_home: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fpcache, "LIMIT", 100)
    old = {(f"{i:064x}", "q"): f"{i:016x}" for i in range(250)}
    target = Path(fpcache.path() or "")
    target.write_bytes(fpcache._encode(old))
    os.chmod(target, 0o600)
    fpcache.clear()
    path = source_file(tmp_path)
    assert cached(path) == truth(ORIGINAL)
    kept = fpcache._decode(target.read_bytes())
    assert len(kept) == 100
    assert list(kept)[-1] == fpcache.key(ORIGINAL.encode(), "target")  # the newest, stored last
    assert list(kept)[0] == (f"{151:064x}", "q")  # the oldest kept: 250 - 99


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_a_fifo_at_the_cache_path_is_neither_opened_nor_waited_for(tmp_path: Path, cache_home: Path) -> None:
    """Before, ``open()`` of the FIFO blocked ``apply_all`` until someone wrote into it."""
    path = source_file(tmp_path)
    target = fpcache.path()
    assert target is not None
    os.mkfifo(target)
    script = textwrap.dedent(f"""
        from patchkit.runtime import fingerprint, fpcache
        print(fingerprint.file_fingerprint({str(path)!r}, ["target"], persist=True))
        fpcache.flush()
    """)
    try:
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "XDG_CACHE_HOME": str(cache_home)})
    except subprocess.TimeoutExpired:
        pytest.fail("the fingerprint cache blocked on a FIFO")
    finally:
        _unblock(target)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == truth(ORIGINAL)


def _unblock(fifo: str) -> None:
    """Let a reader stuck on ``fifo`` go (the old code's), so the test never leaves a process hanging."""
    try:
        if stat.S_ISFIFO(os.lstat(fifo).st_mode):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_with_no_home_folder_the_cache_is_off_and_nothing_lands_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pwd

    def no_entry(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    work = tmp_path / "work"
    work.mkdir()
    path = source_file(tmp_path)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.chdir(work)
    fpcache.clear()
    try:
        assert cached(path) == truth(ORIGINAL)
    finally:
        fpcache.clear()
    assert list(work.iterdir()) == []
    assert fpcache.path() is None


def test_a_relative_xdg_cache_home_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert fpcache.path() == str(tmp_path / "home" / ".cache" / "patchkit" / Path(fpcache.path() or "").name)


@pytest.mark.parametrize(("value", "on"), [("", True), ("1", True), (" On ", True), ("off", False), ("0", False),
                                            ("maybe", False), ("   ", False)])
def test_the_toggle_turns_the_cache_off_and_a_malformed_value_counts_as_off(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:
    monkeypatch.setenv("PATCHKIT_FINGERPRINT_CACHE", value)
    path = source_file(tmp_path)
    assert cached(path) == truth(ORIGINAL)
    assert (fpcache.path() is not None) is on
    assert any((cache_home / "patchkit").iterdir()) is on


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symlinks")
def test_a_symlink_at_the_temporary_name_is_not_written_through(tmp_path: Path, cache_home: Path) -> None:
    """Before, the temporary file was ``<cache>.<pid>.tmp``, opened with ``open(..., 'wb')``: a symlink
    planted there had its target overwritten."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = fpcache.path()
    assert target is not None
    os.symlink(victim, f"{target}.{os.getpid()}.tmp")
    path = source_file(tmp_path)
    assert cached(path) == truth(ORIGINAL)
    assert victim.read_bytes() == b"precious"
    assert stat.S_ISREG(os.lstat(target).st_mode)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symlinks")
def test_a_temporary_name_already_taken_is_never_opened(tmp_path: Path, cache_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a name the attacker guessed (here: every name) is created with O_EXCL | O_NOFOLLOW."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = fpcache.path()
    assert target is not None
    planted = f"{target}.planted.tmp"
    os.symlink(victim, planted)
    monkeypatch.setattr(fpcache, "_scratch_name", lambda _: planted)
    path = source_file(tmp_path)
    assert cached(path) == truth(ORIGINAL)  # the cache is only skipped
    assert victim.read_bytes() == b"precious"
    assert not os.path.exists(target)
    assert os.path.islink(planted)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symlinks")
def test_a_symlink_at_the_cache_path_is_not_read(tmp_path: Path, cache_home: Path) -> None:
    path = source_file(tmp_path, DRIFTED)
    elsewhere = tmp_path / "elsewhere.marshal"
    elsewhere.write_bytes(fpcache._encode({fpcache.key(DRIFTED.encode(), "target"): truth(ORIGINAL)}))
    os.chmod(elsewhere, 0o600)
    target = fpcache.path()
    assert target is not None
    os.symlink(elsewhere, target)
    fpcache.clear()
    assert cached(path) == truth(DRIFTED)
