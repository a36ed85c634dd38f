"""Applying patches at interpreter start, so every process of a job has them.

The wheel ships ``zz_patchkit_autoload.pth`` (see setup.py): ``site`` runs its one line at every
interpreter start, and it calls :func:`run_at_startup` only when ``PATCHKIT_AUTOLOAD`` is in the
environment. Processes a job starts (``multiprocessing`` spawn children, torchrun ranks, Ray
workers, vLLM engine-core processes) inherit that variable and so apply the same patches before any
user code runs.

Start-up must never break: every failure (any exception but ``KeyboardInterrupt``, ``SystemExit``
from a declaration module's argparse included) is logged and kept in :func:`outcome` (the manifest
carries it to the consistency check). Only ``PATCHKIT_STRICT=1`` turns a failure into an exit, with
status :data:`STRICT_EXIT_STATUS`, before the user's program starts.

:func:`load` holds no lock while it imports (extra declaration modules, upstreams through their
hooks): a module it imports may call :func:`load` again, from this thread or another one; that call
returns at once, saying autoload is already running.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

from ..runtime import process_engine, settings
from ..runtime.errors import ConfigError, PatchkitError, PatchkitWarning, UnknownVariableError
from ..runtime.status import Reason, State

logger = logging.getLogger(__name__)

#: Exit status of an interpreter whose strict autoload failed.
STRICT_EXIT_STATUS = 3

#: Set while autoload runs, to the pid running it. A Python process spawned during autoload (by a
#: declaration module, say) sees it and skips autoload, so start-up cannot recurse into itself.
ACTIVE_MARKER = "PATCHKIT_AUTOLOAD_ACTIVE"

_lock = threading.Lock()  # guards _outcome and _running; never held across an import
_outcome: "Outcome | None" = None
#: The thread running load() now, if any.
_running: int | None = None


class AutoloadError(PatchkitError):
    """Strict autoload met a problem before applying anything (an unusable extra-patches module)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class Outcome:
    """What autoload did in this process; JSON-serialisable through :meth:`to_dict`."""

    ran: bool
    #: Why autoload did not run, when it did not.
    skipped: str = ""
    extra_modules: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"ran": self.ran, "skipped": self.skipped, "extra_modules": list(self.extra_modules),
                "problems": list(self.problems)}


def outcome() -> Outcome | None:
    """What autoload did in this process, or None if it was never asked to run."""
    return _outcome


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``PATCHKIT_AUTOLOAD`` asks for autoload. Raises ``ConfigError`` if malformed."""
    env = os.environ if environ is None else environ
    return settings.parse_bool(settings.AUTOLOAD, env.get(settings.AUTOLOAD, ""))


def register_extra_patches(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], list[str]]:
    """Register the patches of the modules named in ``PATCHKIT_EXTRA_PATCHES`` with the engine: see
    :func:`patchkit.runtime.process_engine.register_extra_patches`."""
    return process_engine.register_extra_patches(environ)


def load(environ: Mapping[str, str] | None = None, *, strict: bool | None = None) -> Outcome:
    """Do what autoload does, whatever ``PATCHKIT_AUTOLOAD`` says: register the extra patches and
    ``apply_all()``. Idempotent. In strict mode (argument, else ``PATCHKIT_STRICT``) a problem
    raises (``ConfigError`` for a malformed variable, ``AutoloadError`` for an unusable extra module,
    or the engine's own typed error); otherwise it is in the outcome.

    A call made while autoload runs (an extra module's ``__init__`` calling ``load()``) returns at
    once an outcome that did not run and says so; the running one carries on.
    """
    global _running
    with _lock:
        if _outcome is not None and _outcome.ran:
            return _outcome
        if _running is not None:
            where = "this thread" if _running == threading.get_ident() else f"thread {_running}"
            return Outcome(ran=False, skipped=f"autoload is already running in {where}")
        _running = threading.get_ident()
    try:
        return _load(environ, strict)
    finally:
        with _lock:
            _running = None


def _load(environ: Mapping[str, str] | None, strict: bool | None) -> Outcome:
    global _outcome
    modules: tuple[str, ...] = ()
    problems: list[str] = []
    is_strict = settings.strict_requested(environ, strict)
    try:
        modules, problems = register_extra_patches(environ)
    except ConfigError:
        if is_strict:
            _outcome = Outcome(ran=False, skipped="strict mode: a PATCHKIT_* variable is malformed")
            raise
        # Not strict: apply_all() below parses every variable and reports this one as config_error.
    if problems and is_strict:
        _outcome = Outcome(ran=False, skipped="strict mode: extra patches unusable", problems=tuple(problems))
        raise AutoloadError(problems)
    try:
        records = process_engine.engine().apply_all(environ=environ, strict=strict)
    except Exception as exc:  # strict mode raised: keep it in the outcome, then let it go on
        _outcome = Outcome(ran=True, extra_modules=modules, problems=tuple(problems + [repr(exc)]))
        raise
    problems += [_describe_problem(record) for record in records
                 if record.state is State.FAILED or record.reason is Reason.CONFIG_ERROR]
    # A bad value that disabled nothing is still said (its PatchkitWarning is held back here);
    # a misspelled name is a warning, not a problem that strict mode ends the process for.
    for problem in process_engine.engine().config_problems():
        said = f"{problem} ({settings.consequence(problem)})"
        if isinstance(problem, UnknownVariableError):
            logger.warning("patchkit: autoload: %s", said)
        elif str(problem) not in problems:  # an unreadable switch is there already, as config_error
            problems.append(said)
    _outcome = Outcome(ran=True, extra_modules=modules, problems=tuple(dict.fromkeys(problems)))
    return _outcome


def _describe_problem(record: Any) -> str:
    if record.reason is Reason.CONFIG_ERROR:
        return str(record.detail)  # the same for every patch: reported once
    return f"{record.id}: {record.state.value}" + (f" ({record.reason.value})" if record.reason else "") + \
        f": {record.error or record.detail}"


def _strict(environ: Mapping[str, str] | None, explicit: bool | None) -> bool:
    return settings.strict_requested(environ, explicit)


def run_at_startup() -> None:
    """The ``.pth`` hook's entry point. Never raises; in strict mode, a failure ends the process.

    Runs at most once per process (``site`` may read the same ``.pth`` twice, e.g. through a
    ``lib64`` symlink), and not at all in a process spawned while another one autoloads. Anything
    raised in here but ``KeyboardInterrupt`` is reported: an exception escaping a ``.pth`` line,
    ``SystemExit`` above all, is a fatal interpreter error (``init_import_site``).
    """
    global _outcome
    if _outcome is not None:
        return
    marker = os.environ.get(ACTIVE_MARKER)
    if marker is not None and marker != str(os.getpid()):
        # Spawned during the parent's autoload: skip, and let this process's own children autoload.
        del os.environ[ACTIVE_MARKER]
        _outcome = Outcome(ran=False, skipped=f"spawned while process {marker} was autoloading")
        return
    handler = _startup_handler()
    os.environ[ACTIVE_MARKER] = str(os.getpid())
    try:
        try:
            on = requested()
        except ConfigError as exc:
            _outcome = Outcome(ran=False, skipped="PATCHKIT_AUTOLOAD is malformed", problems=(str(exc),))
            _report(_outcome, strict=_strict(None, None))
            return
        if not on:
            _outcome = Outcome(ran=False, skipped=f"{settings.AUTOLOAD} is off")
            return
        try:
            with warnings.catch_warnings():
                # _report below states every problem on stderr once; no second line per warning.
                warnings.simplefilter("ignore", PatchkitWarning)
                load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # strict mode, or SystemExit/any error from code autoload ran
            if _outcome is None or not _outcome.problems:
                _outcome = Outcome(ran=_outcome.ran if _outcome else False,
                                   skipped=_outcome.skipped if _outcome else "", problems=(repr(exc),))
        assert _outcome is not None
        _report(_outcome, strict=_strict(None, None))
        _write_manifests(os.environ.get(settings.MANIFEST_DIR, ""))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a bug here must still not stop the interpreter
        logger.error("patchkit: autoload failed: %r", exc, exc_info=True)
        if _strict(None, None):
            _exit_strict()
    finally:
        if os.environ.get(ACTIVE_MARKER) == str(os.getpid()):
            del os.environ[ACTIVE_MARKER]
        if handler is not None:
            logging.getLogger("patchkit").removeHandler(handler)


def _write_manifests(folder: str) -> None:
    """With ``PATCHKIT_MANIFEST_DIR`` set, write this process's manifest there now and again at exit.

    Now, because a process killed by its launcher runs no exit handler; at exit, because patches
    pending now install when their upstream is imported later.
    """
    try:
        chosen = settings.parse_folder(settings.MANIFEST_DIR, folder)
    except ConfigError:
        return  # reported with the other malformed variables, as config_error
    if chosen is None:
        return
    folder = chosen
    import atexit
    import socket

    from .manifest import collect

    path = os.path.join(folder, f"{socket.gethostname()}-{os.getpid()}.json")

    def write() -> None:
        try:
            collect().write(path)
        except Exception as exc:  # a full disk must not fail the user's process
            logger.error("patchkit: cannot write the manifest to %s (%s): %r", path, settings.MANIFEST_DIR, exc)

    write()
    atexit.register(write)


def _report(result: Outcome, strict: bool) -> None:
    if result.problems:
        logger.error("patchkit: autoload: %d problem(s) in process %d: %s", len(result.problems), os.getpid(),
                     "; ".join(result.problems))
    if result.problems and strict:
        _exit_strict()


def _exit_strict() -> None:
    logger.critical("patchkit: autoload failed in strict mode (%s=1); exiting with status %d",
                    settings.STRICT, STRICT_EXIT_STATUS)
    sys.stderr.flush()
    # SystemExit inside site's .pth processing is a fatal interpreter error with a confusing
    # traceback; nothing of the user's program has run yet, so there is nothing to clean up.
    os._exit(STRICT_EXIT_STATUS)


def _startup_handler() -> logging.Handler | None:
    """A stderr handler for the duration of autoload, when nothing else would show its records.

    At interpreter start no program has configured logging yet, and the ``patchkit`` logger's
    NullHandler would swallow a failure that makes this process differ from the others.
    """
    root = logging.getLogger()
    ours = logging.getLogger("patchkit")
    if root.handlers or any(not isinstance(h, logging.NullHandler) for h in ours.handlers):
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.setLevel(logging.WARNING)
    ours.addHandler(handler)
    return handler


def _after_fork_in_child() -> None:
    # A thread that held the lock, or was running load(), does not exist in the child.
    global _lock, _running
    _lock = threading.Lock()
    if _running != threading.get_ident():
        _running = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
