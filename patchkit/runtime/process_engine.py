"""The process-wide engine: the one ``patchkit.apply_all()``, autoload, manifests and self-checks use.

It is built from the shipped catalogue on first use, and the declaration modules named in
``PATCHKIT_EXTRA_PATCHES`` are registered with it by :func:`register_extra_patches`. Here, in the
runtime, rather than in the ``patchkit`` package itself, so the modules beneath that package
(``patchkit.processes``, ``patchkit.selfcheck``) reach it without importing back up into the package
that imports them.

**Before the engine is built.** The first ``patchkit.apply_all()`` of a process usually finds every
patch switched off, its upstream not installed, or waiting for its upstream's code to be imported:
what the catalogue's index alone settles (:mod:`.settle`). :func:`apply_all_from_index` does that
much without the engine (no engine, entries, declarations, decision or version parsing is imported
or built): it reads the index, settles every patch, records the outcome here and arms the
post-import hooks. The engine is built when something needs it: one of those modules is imported
(the hook builds it and hands it the import), or a caller asks for it (``patchkit.status()``,
``explain``, ``apply``, ``revert``, ``engine()`` itself). It then takes over the recorded outcome
(:meth:`.engine.Engine.take_over`), as though its own ``apply_all()`` had recorded it, so every
patch is in its status. Whatever the index does not settle alone (a target module imported already,
a toggle that is not only ``PATCHKIT_ENABLE``/``DISABLE``/``OPT_IN``/``FORCE``, a configuration
problem to report, a stale index), the call goes to the engine, as before.

Locks. ``_engine_lock`` is held while the engine is built or the start-up pass settles, never while a
hook is armed (an armed hook may run at once and build the engine), nor while the engine's modules
are first imported (their imports run post-import hooks, which may ask for the engine in this thread);
it is renewed in a forked child.
"""

from __future__ import annotations

import _thread  # `threading.Lock` is this lock; importing `threading` costs start-up a millisecond
import os

# forking: its fork handlers renew the hooks' locks in a child, armed hooks or not.
from . import forking, import_watch, index, installed, logs, settings, settle  # noqa: F401
from .status import PatchStatus, Reason, State

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Mapping, Sequence

    from .engine import Engine

_engine: Engine | None = None
_engine_lock = _thread.allocate_lock()
#: What the start-up pass settled: each patch's status, by patch id, and with which settings; None: it
#: has not run (or the engine took it over).
_settled: dict[str, PatchStatus] | None = None
_settled_with: settings.Settings | None = None
logger = logs.get("patchkit")


def _after_fork_in_child() -> None:
    global _engine_lock
    _engine_lock = _thread.allocate_lock()  # a thread that held it does not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def engine() -> Engine:
    """The process-wide engine, loading the shipped catalogue on first use (and taking over what the
    start-up pass settled, if it ran)."""
    global _engine, _settled
    if _engine is None:
        # Imported before the lock is taken: the first import of a module the engine needs (threading,
        # say) runs its post-import hooks, and one of them may ask for the engine in this thread.
        from . import catalogue
        from .engine import Engine

        with _engine_lock:
            if _engine is None:
                patches, errors = catalogue.load()
                built = Engine(patches, errors)
                try:
                    if _settled is not None and _settled_with is not None:
                        built.take_over(_settled, _settled_with)
                except BaseException:
                    # Interrupted (Ctrl-C) half-way: the next call builds another engine, and this one,
                    # kept alive by the traceback, must not hear imports beside it (both would install).
                    import_watch.forget(built)
                    raise
                _engine, _settled = built, None
                import_watch.forget(_WATCH)
    return _engine


class _StartUpWatch:
    """Hears the imports the start-up pass waits for, while no engine exists: the first one builds
    the engine, which hears every later one itself."""

    _strict = False  # the start-up pass runs only where strict mode is off

    def _module_imported(self, module: str) -> None:
        engine()._module_imported(module)


_WATCH = _StartUpWatch()


def apply_all_from_index(environ: Mapping[str, str] | None = None,
                         catalogues: Sequence[str] = (index.CATALOGUE_PACKAGE,)) -> list[PatchStatus] | None:
    """``apply_all()`` without arguments in a process whose engine is not built, settled from the
    catalogue's index alone (see the module doc); None if this call needs the engine (the caller then
    asks it). A call with an explicit argument goes to the engine: the caller does not come here.

    Taken only where it decides exactly what the engine would: the catalogue's index current, every
    ``PATCHKIT_*`` variable readable and none asking for strict mode or a log level, and every patch
    switched off, not installed, or waiting for modules not imported yet.
    ``catalogues``: the catalogue packages whose indexes are read (the shipped one; the start-up
    benchmark adds one it generates, whose patches the engine, built later, does not know).
    """
    global _settled, _settled_with
    if _engine is not None:
        return None
    with _engine_lock:
        if _engine is not None:
            return None
        indexes = []
        for package in catalogues:
            try:
                catalogue_index = index.current(package)
            except Exception:
                return None  # an index that fails to import: the engine reads the declarations and says so
            if catalogue_index is None:
                return None  # no index, another format, or stale: the engine reads the declarations and says so
            indexes.append(catalogue_index)
        ids = [patch_id for catalogue_index in indexes for patch_id in catalogue_index.DECLARED_IN]
        if len(set(ids)) != len(ids):
            return None  # an id declared twice: the engine refuses it
        reading = settings.read(environ, known_ids=ids)
        chosen = reading.settings
        if reading.problems or reading.blocking is not None or chosen.strict or chosen.log_level is not None:
            return None  # each problem is reported by the engine, once; strict mode raises there
        outcome: dict[str, PatchStatus] = {}
        find = installed.Answers()
        for catalogue_index in indexes:
            if not _settle_index(catalogue_index, chosen, find, outcome):
                return None  # a patch needs the decision: the engine decides it, and the rest as before
        # Sorted by id, as the engine keeps them.
        _settled, _settled_with = {patch_id: outcome[patch_id] for patch_id in sorted(outcome)}, chosen
        import_watch.listen(_WATCH)  # under the lock: an engine built from now on takes over, and forgets it
        settled_now = _settled
    # The lock released first: a hook armed for a module imported meanwhile runs at once, and builds the engine.
    import_watch.watch(module for status in settled_now.values() for module in status.waiting_for)
    return list(settled_now.values())


def _settle_index(catalogue_index: ModuleType, chosen: settings.Settings, find: installed.Answers,
                  outcome: dict[str, PatchStatus]) -> bool:
    """Settle every patch of one catalogue's index into ``outcome`` (by id); False as soon as one needs
    the decision. The index is read by its columns (see ``patchkit.matrix.catalogue_index``): each
    upstream is settled once for all its patches, and a patch leaves nothing behind but its status
    (every object a process keeps counts towards the garbage collector's next collection)."""
    upstreams: dict[int, settle.Upstream] = {}
    waits_for, opt_in = catalogue_index.WAITS_FOR, catalogue_index.OPT_IN
    for patch_id, position in catalogue_index.UPSTREAM.items():
        off = settle.switched_off(patch_id, patch_id in opt_in, chosen)
        if off is not None:
            outcome[patch_id] = PatchStatus(patch_id, State.SKIPPED, *off)
            continue
        upstream = upstreams.get(position)
        if upstream is None:
            distributions, required = catalogue_index.UPSTREAMS[position]
            found = settle.upstream(distributions, required, find)
            if found is None:
                return False  # a version known only once imported, an upstream installed in part
            upstream = upstreams[position] = found
        status = settle.from_index(patch_id, upstream, waits_for[patch_id], import_watch.imported)
        if status is None:
            return False  # a module it waits for is imported already, or nothing to wait for
        outcome[patch_id] = status
        if status.reason is Reason.NOT_INSTALLED:
            logger.debug("patchkit: %s skipped: %s", patch_id, status.detail)
    return True


def register_extra_patches(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], list[str]]:
    """Register the patches of the modules named in ``PATCHKIT_EXTRA_PATCHES`` with the engine.

    Each module is imported and its ``PATCHES`` registered, relative references resolving against
    the module's package, as for the catalogue: all of a module's patches, or none of them (one
    malformed patch, an id declared twice, or an id another declaration already registered keeps
    the whole module out). A module that fails is reported and skipped; the others still register.
    Returns the module names and the problems met. Raises ``ConfigError`` if the variable is malformed.
    """
    from . import catalogue

    env = os.environ if environ is None else environ
    modules = settings.parse_modules(settings.EXTRA_PATCHES, env.get(settings.EXTRA_PATCHES, ""))
    problems = []
    found = engine()
    for name in modules:
        try:
            patches = catalogue.declarations(name)
            found.register_all(patches, name.rpartition(".")[0] or None, known_ok=True)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # one broken module (even one calling sys.exit) must not keep the others out
            problems.append(f"{settings.EXTRA_PATCHES}: cannot register patches from {name}: {exc!r}")
    return modules, problems
