"""The engine: the registry of patches in this process, applying and reverting them through their decisions.

What a patch should do (which variant, which state, why) is decided by :mod:`.decision`, a pure
function. The engine gathers the facts the decision needs, records its outcome and orchestrates
the rest, each part in a module of its own: what it holds per patch (:mod:`.entries`), carrying
out a claimed install (:mod:`.jobs`, through :mod:`.installer`), hearing of imports
(:mod:`.import_watch`, over :mod:`.hooks`) and forks (:mod:`.forking`).

A patch moves through its states one at a time:

    registered -> skipped | pending -> applied | forced | failed | skipped(target_missing)
    applied | forced | pending -> reverted -> (considered again by the next apply)

Locks, and their order. One re-entrant lock per engine guards its registry and every state
change, so ``apply_all``/``revert_all`` from many threads and import hooks firing mid-call see a
consistent registry. Post-import hooks run inside Python's import machinery, holding that module's
import lock, and then take the engine lock: the order is always *import lock, then engine lock*.
So the engine lock is never held across an import of an upstream or implementation module (nor
across the drift check): installing is done in three steps, (1) under the lock, decide and claim
the patch (a ticket: no other thread installs it meanwhile); (2) without it, import what the
variant references and check drift; (3) under the lock again, set the attributes, if the ticket
still holds (a ``revert`` in between cancels it). Steps 2 and 3 are :func:`.jobs.carry_out`.
Factories (``Wrap``) and ``Call`` install/undo functions run in step 3, under the lock: they must
not import upstream modules themselves (import at the top of the implementation module, which
step 2 imports). The watch lock (:mod:`.import_watch`) is never held together with an engine lock,
except by the fork handlers (:mod:`.forking`), which take it first.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading

from . import forking, gating, import_watch, interrupts, jobs, logs, settle
from . import settings as settings_module
from .catalogue import CatalogueLoadFailure, Indexed, Registered, normalized
from .decision import Decision, Facts, Step, Trigger, decide, next_step
from .entries import Entry, Job, Ticket, Work
from .errors import (
    ConfigError,
    DeclarationError,
    ForceRefusedError,
    ForeignWrapperError,
    PatchkitWarning,
    RevertError,
    UndoError,
    UnknownPatchError,
    UnknownVariableError,
    UnsupportedVersionError,
)
from .settings import Settings
from .settle import switched_off
from .status import PatchStatus, Reason, State

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:  # the drift module and the installer are imported only when a patch installs
    from typing import Any, Iterable, Iterator, Mapping, Sequence

    from .declaration import Patch
    from .drift import RecordSource
    from .installer import Installed, Registration

logger = logs.get("patchkit")


class Engine:
    """A registry of patches and their state in this process.

    The module-level functions of :mod:`patchkit` use one engine loaded from the catalogue; tests
    and embedders may build their own from explicit ``Registered`` patches.
    """

    def __init__(self, patches: Iterable[Registered | Indexed] = (),
                 catalogue_errors: Iterable[CatalogueLoadFailure] = (), matrix: "RecordSource" = None) -> None:
        if matrix is not None and not callable(matrix):
            from collections.abc import Mapping  # for this check only: `typing` is not imported at start-up

            if not isinstance(matrix, Mapping):
                raise TypeError(f"Engine(matrix=...) takes records, not {type(matrix).__name__}: for a matrix "
                                f"file or a loaded Matrix, pass patchkit.matrix.index.source(it)")
        self._lock = threading.RLock()
        #: Where drift fingerprints come from (see patchkit.runtime.drift.RecordSource); read on first install.
        self._matrix = matrix
        self._entries: dict[str, Entry] = {}
        self._catalogue_errors = tuple(catalogue_errors)
        self._strict = False
        self._config_problems: tuple[ConfigError, ...] = ()
        with self._lock:
            self._add(list(patches))
        import_watch.listen(self)
        forking.guard(self)

    # -- registry -------------------------------------------------------------------------------

    def register(self, patch: Patch, package: str | None = None) -> None:
        """Add a patch. Its relative references resolve against ``package``."""
        self.register_all((patch,), package)

    def register_all(self, patches: Sequence[Patch], package: str | None = None, *,
                     known_ok: bool = False) -> None:
        """Add several patches, all or none: one malformed or clashing patch registers none of them.

        With ``known_ok``, a patch already registered with the very same declaration is skipped
        instead of being a clash (registering one module's patches again is then harmless).
        """
        with self._lock:
            self._add([Registered(patch, package) for patch in patches], known_ok=known_ok)

    def _add(self, records: Sequence[Registered | Indexed], *, known_ok: bool = False) -> None:
        """:meth:`register_all` for ``Registered`` records and the catalogue index's ``Indexed`` ones
        (validated when their declaration module is imported, before their first install). Under the lock."""
        seen: set[str] = set()
        adding: list[Registered | Indexed] = []
        clashes = []
        for record in records:
            if isinstance(record, Indexed):
                patch_id = record.id
            else:
                from .declaration import validate  # registered directly: declarations are in use already

                validate(record.patch)
                patch_id = record.patch.id
                # Copied, so a caller changing its declaration afterwards does not change the registered patch.
                record = record._replace(patch=normalized(record.patch))
            if patch_id in seen:
                raise DeclarationError(f"patch id {patch_id!r} is declared twice")
            seen.add(patch_id)
            if patch_id in self._entries:
                if not (known_ok and isinstance(record, Registered) and self._entries[patch_id].patch == record.patch):
                    clashes.append(patch_id)
                continue
            adding.append(record)
        if clashes:
            raise DeclarationError(f"patch ids already registered: {', '.join(clashes)}")
        for record in adding:
            entry = Entry(record)
            self._entries[entry.id] = entry
        self._entries = dict(sorted(self._entries.items()))

    @property
    def matrix(self) -> "RecordSource":
        """Where this engine reads recorded fingerprints from (None: the records shipped with patchkit)."""
        return self._matrix

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def patch(self, patch_id: str) -> Patch:
        with self._lock:
            return self._entry(patch_id, "patch id").patch

    def installed_actions(self, patch_id: str) -> tuple[Installed | Registration, ...]:
        """What a patch installed in this process (empty unless it is applied), newest last."""
        with self._lock:
            return tuple(self._entry(patch_id, "patch id").installed)

    def package(self, patch_id: str) -> str | None:
        """The package a patch's relative references (actions, self-check) resolve against."""
        return self._entry(patch_id, "patch id").registered.package

    def _entry(self, patch_id: str, variable: str) -> Entry:
        entry = self._entries.get(patch_id)
        if entry is None:
            import difflib

            close = difflib.get_close_matches(patch_id, list(self._entries), n=3, cutoff=0.5)
            raise UnknownPatchError(variable, patch_id, close)
        return entry

    # -- applying -------------------------------------------------------------------------------

    def apply_all(
        self,
        *,
        enable: Sequence[str] | str | None = None,
        disable: Sequence[str] | str | None = None,
        force: Sequence[str] | str | None = None,
        opt_in: Sequence[str] | str | None = None,
        strict: bool | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> list[PatchStatus]:
        """Apply every patch that applies here; idempotent. Returns every patch's status.

        Explicit arguments override the ``PATCHKIT_*`` variables; a malformed argument or an unknown
        id in one raises ``ConfigError``. A bad variable costs only what it is about (see
        :func:`patchkit.runtime.settings.consequence`), said once per process as a ``PatchkitWarning``;
        an unreadable ``PATCHKIT_DISABLE``/``ENABLE``/``AUTOLOAD`` applies nothing (every patch is
        skipped with ``config_error``). Strict mode raises the ``ConfigError`` instead.

        A patch that is disabled (``disable=`` or ``PATCHKIT_DISABLE``) while it is applied is
        reverted; ``ForeignWrapperError``/``UndoError`` if that revert is refused or fails.
        """
        work = Work()
        with self._abandoned_on_interrupt(work):
            with self._lock:
                chosen = self._settings(environ, list(self._entries.values()), enable=enable, disable=disable,
                                        force=force, opt_in=opt_in, strict=strict)
                if chosen is None:
                    return self.status()
                for entry in self._entries.values():
                    # Disabled after it was installed: take it out, then it is decided (skipped) below.
                    # By id: an entry read from the catalogue's index stays unmade until it is needed.
                    if (entry.state.installed or entry.ticket is not None) and chosen.is_disabled(entry.id):
                        self.revert(entry.id)
                for entry in self._entries.values():
                    step = next_step(entry.state, Trigger.APPLY_ALL, claimed=entry.ticket is not None,
                                     displaced=entry.state.installed and bool(entry.displaced()))
                    if step is Step.REINSTALL:
                        self._forget_displaced(entry)
                        step = next_step(entry.state, Trigger.APPLY_ALL, claimed=False)
                    if step is Step.DECIDE:
                        self._consider(entry, chosen, work, lazily=True)
            jobs.carry_out_all(self, work)
        return self.status()

    def apply(self, *patterns: str, import_targets: bool = False, strict: bool | None = None,
              environ: Mapping[str, str] | None = None) -> list[PatchStatus]:
        """Apply the patches matching ``patterns`` (ids or globs), opt-in ones included.

        ``PATCHKIT_DISABLE`` still wins: it is the switch that turns a misbehaving patch off without a
        code change. With ``import_targets``, target modules are imported now so the patches install
        at once instead of waiting. An unknown or malformed pattern raises ``UnknownPatchError`` /
        ``ConfigError``; a malformed ``PATCHKIT_*`` variable is handled as in :meth:`apply_all`.
        """
        work = Work()
        with self._abandoned_on_interrupt(work):
            with self._lock:
                explicit = settings_module.parse_patterns("argument patterns", list(patterns))
                settings_module.check_known(Settings(enable=explicit), list(self._entries))
                selected = [e for e in self._entries.values() if settings_module.matches_any(e.id, explicit)]
                chosen = self._settings(environ, selected, enable=list(patterns), opt_in=list(patterns),
                                        strict=strict)
                if chosen is None:
                    return [entry.record() for entry in selected]
                for entry in selected:
                    if next_step(entry.state, Trigger.APPLY, claimed=entry.ticket is not None) is Step.DECIDE:
                        self._consider(entry, chosen, work)
            jobs.carry_out_all(self, work)
        if import_targets:
            self._import_waiting(selected)
        with self._lock:
            return [entry.record() for entry in selected]

    @contextlib.contextmanager
    def applied(self, *patterns: str, strict: bool | None = None) -> Iterator[list[PatchStatus]]:
        """Apply ``patterns`` now (importing their targets) and revert on exit; for tests.

        On exit every patch it applied is reverted, even when one of them refuses: the failures are
        raised together afterwards, as one ``RevertError``.
        """
        with self._lock:
            before = {pid for pid, e in self._entries.items() if e.state.installed or e.state is State.PENDING}
        records = self.apply(*patterns, import_targets=True, strict=strict)
        try:
            yield records
        finally:
            self._revert_each([record.id for record in records if record.id not in before], refusals_raise=True)

    def import_targets(self, leave: Iterable[str] = ()) -> list[PatchStatus]:
        """Import the modules every pending patch waits for, so it installs now (``patchkit status``);
        the patches ``leave`` names stay waiting."""
        left = set(leave)
        with self._lock:
            entries = [entry for entry in self._entries.values() if entry.patch.id not in left]
        self._import_waiting(entries)
        return self.status()

    def _import_waiting(self, entries: Iterable[Entry]) -> None:
        """Import what ``entries`` wait for, without the lock: their hooks then install them."""
        for entry in entries:
            if entry.undecided:  # waiting for any of its variants' modules: first choose the variant
                self._decide_again(entry, "while importing its targets", None)
            with self._lock:
                waiting = entry.waiting_for if entry.state is State.PENDING else ()
            for module in waiting:
                if module in sys.modules:
                    continue
                try:
                    importlib.import_module(module)
                except Exception as exc:  # the upstream itself fails to import here
                    with self._lock:
                        entry.set(State.FAILED, detail=f"importing {module} failed", error=repr(exc))
                    logger.error("patchkit: %s: importing %s failed: %r", entry.patch.id, module, exc)
                    if self._strict:
                        raise

    def _settings(self, environ: Mapping[str, str] | None, scope: Sequence[Entry],
                  **explicit: Any) -> Settings | None:
        """Parse the toggles and report each problem once per process (:func:`report_config_problem`).

        Strict: the first problem that is not a misspelled name raises. Otherwise an unreadable switch
        marks ``scope`` config_error and returns None; any other problem costs only what it is about.
        """
        reading = settings_module.read(environ, known_ids=list(self._entries), **explicit)
        self._config_problems = reading.problems
        serious = [p for p in (reading.blocking, *reading.problems)
                   if p is not None and not isinstance(p, UnknownVariableError)]
        if serious and settings_module.strict_requested(environ, explicit.get("strict")):
            raise serious[0]
        for problem in reading.problems:
            report_config_problem(problem)
        if reading.blocking is not None:
            for entry in scope:
                if not entry.state.installed and entry.state is not State.PENDING and entry.ticket is None:
                    entry.set(State.SKIPPED, Reason.CONFIG_ERROR, str(reading.blocking))
            return None
        self._use(reading.settings)
        return reading.settings

    def config_problems(self) -> tuple[ConfigError, ...]:
        """The configuration problems the latest ``apply_all``/``apply`` met (``patchkit status`` exits
        non-zero on any)."""
        with self._lock:
            return self._config_problems

    def _use(self, chosen: Settings) -> None:
        self._strict = chosen.strict
        if chosen.log_level is not None:
            logger.setLevel(chosen.log_level)

    def _consider(self, entry: Entry, chosen: Settings, work: Work, lazily: bool = False) -> None:
        """Decide ``entry`` with ``chosen`` settings. ``lazily`` (``apply_all``): a patch read from the
        catalogue's index is first settled from the index alone, if that is enough (:mod:`.settle`:
        its upstream not installed, or waiting undecided for its code)."""
        entry.settings = chosen
        # Before any fact is gathered: a switched-off patch costs nothing.
        off = switched_off(entry.id, entry.opt_in, chosen)
        if off is not None:
            entry.set(State.SKIPPED, *off)
            return
        indexed = entry.indexed if lazily else None
        settled = None
        if indexed is not None:
            upstream = work.upstream(indexed.distributions, indexed.required)
            if upstream is not None:
                settled = settle.from_index(entry.id, upstream, indexed.modules, import_watch.imported)
        if settled is not None:
            self._settle(entry, settled)
            work.watch.extend(settled.waiting_for)
            if settled.reason is Reason.NOT_INSTALLED:
                logger.debug("patchkit: %s skipped: %s", entry.id, entry.detail)
        else:
            self._advance_safely(entry, "while applying", work)

    @staticmethod
    def _settle(entry: Entry, settled: PatchStatus) -> None:
        """Record what the index alone settled. This keeps ``apply_all()`` flat in the size of the
        catalogue: such a patch costs a few lookups now, and its declaration (made from the index,
        then imported), its variant and its version check are paid for when its upstream's code is
        imported (the post-import hook decides it, as it does any pending patch). The outcome is
        the same either way, only when it is reached differs: a version outside every range is
        reported once the upstream is imported."""
        entry.set(settled.state, settled.reason, settled.detail)
        entry.versions = dict(settled.versions)
        if settled.state is State.PENDING:
            entry.waiting_for, entry.undecided = settled.waiting_for, True

    def take_over(self, settled: Mapping[str, PatchStatus], chosen: Settings) -> None:
        """Record what the start-up pass of a process settled from the catalogue's index with
        ``chosen`` settings (:mod:`.process_engine`: ``apply_all()`` before this engine was built),
        as this engine's ``apply_all()`` would have recorded it. Patches this engine registered from
        the index and has not decided yet take those states; the post-import hooks that pass armed
        tell this engine when their modules are imported."""
        with self._lock:
            self._use(chosen)
            self._config_problems = ()
            for patch_id, outcome in settled.items():
                entry = self._entries.get(patch_id)
                if entry is None or entry.indexed is None or entry.state is not State.REGISTERED:
                    continue
                entry.settings = chosen
                self._settle(entry, outcome)

    def _advance_safely(self, entry: Entry, context: str, work: Work, just_imported: str | None = None) -> None:
        """``_advance``, with anything unexpected recorded as a failure of this patch alone.

        The failure is recorded in strict mode too, before it is raised: the status never says
        ``pending`` for a patch that failed.
        """
        try:
            self._advance(entry, work, just_imported)
        except Exception as exc:
            if not isinstance(exc, (UnsupportedVersionError, ForceRefusedError)):  # these recorded their skip
                entry.fail(context, exc)
            if entry.settings.strict:
                raise

    def _decide_again(self, entry: Entry, context: str, just_imported: str | None) -> None:
        """Decide ``entry`` afresh and carry out what that decides: after its declaration module,
        imported before its first install, declared it otherwise than the catalogue's index said."""
        work = Work()
        with self._abandoned_on_interrupt(work):
            with self._lock:
                if next_step(entry.state, Trigger.APPLY, claimed=entry.ticket is not None) is Step.DECIDE:
                    self._advance_safely(entry, context, work, just_imported)
            jobs.carry_out_all(self, work)

    def _facts(self, entry: Entry, work: Work, just_imported: str | None) -> Facts:
        """What :func:`~patchkit.runtime.decision.decide` needs to know about this process for ``entry``.

        ``just_imported`` is the module whose post-import hook is running: it has finished executing
        though Python still flags it as initialising until the hook returns.
        """
        patch, strict = entry.patch, entry.settings.strict
        return Facts(
            versions={dist: work.installed_version(dist, patch.version_modules.get(dist))
                      for dist in patch.distributions},
            imported=lambda module: module == just_imported or import_watch.imported(module),
            identity_blocker=lambda variant: gating.identity_blocker(patch, variant, self._matrix, strict),
            identity=lambda variant: gating.identity(patch, variant, self._matrix, strict),
        )

    def _advance(self, entry: Entry, work: Work, just_imported: str | None = None) -> None:
        """Take ``entry`` as far as the installed upstreams and imported modules allow, under the lock:
        record a skip, wait for an import (``work.watch``), or claim the install (``work.jobs``)."""
        facts = self._facts(entry, work, just_imported)
        entry.versions = {dist: v.raw for dist, v in facts.versions.items()}
        decision = decide(entry.patch, entry.settings, facts)
        if decision.variant is not None:
            entry.variant = decision.variant
        if decision.installs:
            # The job is listed before the entry is claimed: an interruption in between leaves no
            # claim that jobs.abandon would not find. Checked again with signals held: an apply_all() that
            # a signal handler ran in this thread since this call chose the entry (the lock is
            # reentrant) may have claimed or installed it already.
            with interrupts.deferred():
                if entry.ticket is not None or entry.state.installed:
                    return
                ticket = Ticket()
                work.jobs.append(Job(entry, ticket, decision, just_imported))
                entry.ticket = ticket
        elif decision.state is State.PENDING:
            # Hooks are armed after the lock is released (work.watch): one may fire at once (the
            # module was imported meanwhile) and must find the entry already pending.
            entry.set(State.PENDING, None, decision.detail)
            entry.waiting_for = decision.waiting_for
            work.watch.extend(decision.waiting_for)
        else:
            self._skip(entry, decision)

    def _skip(self, entry: Entry, decision: Decision) -> None:
        """Record a skip first, then log it: strict mode raises its refusal, and the status must
        already say why."""
        patch = entry.patch
        entry.set(State.SKIPPED, decision.reason, decision.detail, error=decision.error)
        if decision.refusal is not None and entry.settings.strict:
            raise decision.refusal
        if decision.reason is Reason.NOT_INSTALLED:
            logger.debug("patchkit: %s skipped: %s", patch.id, decision.detail)
        elif decision.reason is Reason.UNSUPPORTED_VERSION:
            logger.warning("patchkit: %s skipped: %s", patch.id, decision.detail)
        elif decision.refusal is not None:
            logger.error("patchkit: %s", decision.refusal)
        elif decision.reason is Reason.NATIVE:
            logger.info("patchkit: %s not needed: %s", patch.id, decision.detail)

    def _forget_displaced(self, entry: Entry) -> None:
        """Before installing a displaced patch again, restore the targets it still holds (an install
        is all or nothing, so it starts from the originals); a reloaded target already holds them. A
        foreign wrapper on one of those leaves it as it is, reported displaced."""
        from .installer import uninstall_all  # imported already: the patch was installed

        with interrupts.deferred():
            try:
                uninstall_all(entry.patch.id, entry.installed)
            except (ForeignWrapperError, UndoError) as exc:
                logger.error("patchkit: %s is displaced and cannot be installed again: %s", entry.patch.id, exc)
                return
            entry.set(State.REVERTED, detail="displaced: its module was reloaded; installing it again")

    @contextlib.contextmanager
    def _abandoned_on_interrupt(self, work: Work) -> Iterator[None]:
        """Run a decide-and-install pass; on any exception, give up the claims it still holds."""
        try:
            yield
        except BaseException:
            jobs.abandon(self, work)
            raise

    def _module_imported(self, module: str) -> None:
        """Post-import hook: advance every patch that was waiting for ``module``."""
        work = Work()
        first: Exception | None = None
        with self._abandoned_on_interrupt(work):
            with self._lock:
                for entry in self._entries.values():
                    if module not in entry.waiting_for:
                        continue
                    if next_step(entry.state, Trigger.IMPORT, claimed=entry.ticket is not None) is Step.DECIDE:
                        try:
                            self._advance_safely(entry, f"on import of {module}", work, just_imported=module)
                        except Exception as exc:  # strict: recorded; raised once the others are decided
                            first = first or exc
            jobs.carry_out_all(self, work)
        if first is not None:
            raise first

    # -- reverting ------------------------------------------------------------------------------

    def revert(self, patch_id: str) -> PatchStatus:
        """Restore the originals of one patch.

        Raises ``ForeignWrapperError`` if another wrapper sits on top of patchkit's (the patch then
        stays applied), or ``UndoError`` if an undo step raised: every other target is restored,
        the patch is ``failed`` and a later ``revert()`` retries the steps that raised.
        """
        with self._lock:
            entry = self._entry(patch_id, "patch id")
            cancelled = entry.ticket is not None
            entry.ticket = None  # an install in progress in another thread will not commit
            if entry.installed:
                try:
                    self._uninstall(entry)
                except (ForeignWrapperError, UndoError):
                    raise
                except BaseException:
                    # Interrupted half-way: finish restoring (a second signal is held meanwhile), so
                    # no patch is left half-reverted under a status that says applied.
                    with interrupts.deferred(), contextlib.suppress(ForeignWrapperError, UndoError):
                        self._uninstall(entry)
                    raise
            elif entry.state.installed:  # an interrupted revert restored everything but had not said so
                entry.set(State.REVERTED, detail="originals restored")
            elif entry.state is State.PENDING or cancelled:
                entry.set(State.REVERTED, detail="no longer waiting for import")
            return entry.record()

    def _uninstall(self, entry: Entry) -> None:
        """Restore ``entry``'s originals and record the outcome (under the lock)."""
        from .installer import uninstall_all  # imported already: something was installed

        try:
            uninstall_all(entry.patch.id, entry.installed)
        except ForeignWrapperError as exc:
            entry.reason, entry.detail = Reason.FOREIGN_WRAPPER, str(exc)
            raise
        except UndoError as exc:
            entry.set(State.FAILED, detail="partly reverted", error=str(exc))
            raise
        entry.set(State.REVERTED, detail="originals restored")
        logger.info("patchkit: %s reverted", entry.patch.id)

    def revert_all(self) -> list[PatchStatus]:
        """Revert every patch that can be, then raise one ``RevertError`` naming each that could not.

        A refusal (``ForeignWrapperError``: a third party's wrapper on top) only leaves that patch
        applied, saying why in its status, unless strict mode makes it an error too.
        """
        self._revert_each(list(reversed(self.ids())), refusals_raise=None)
        return self.status()

    def _revert_each(self, patch_ids: Sequence[str], refusals_raise: bool | None) -> None:
        errors: dict[str, BaseException] = {}
        for patch_id in patch_ids:
            try:
                self.revert(patch_id)
            except ForeignWrapperError as exc:
                logger.error("patchkit: %s", exc)
                if refusals_raise or (refusals_raise is None and self._strict):
                    errors[patch_id] = exc
            except Exception as exc:  # an undo step raised: go on with the others
                logger.error("patchkit: %s: revert failed: %s", patch_id, exc)
                errors[patch_id] = exc
        if errors:
            raise RevertError(errors)

    # -- fork (see patchkit.runtime.forking) ----------------------------------------------------

    def _hold_for_fork(self) -> None:
        self._lock.acquire()

    def _release_after_fork(self) -> None:
        self._lock.release()

    def _renew_in_child(self, thread: int) -> None:
        """In a forked child, where only ``thread`` exists: a fresh lock, and no claim of a vanished
        thread stands."""
        self._lock = threading.RLock()
        for entry in self._entries.values():
            if entry.ticket is not None and entry.ticket.thread != thread:
                entry.ticket = None

    # -- reporting ------------------------------------------------------------------------------

    def status(self, *patterns: str) -> list[PatchStatus]:
        """Every patch's status (or those matching ``patterns``), sorted by id."""
        with self._lock:
            records = [entry.record() for entry in self._entries.values()
                       if not patterns or settings_module.matches_any(entry.id, patterns)]
            if not patterns:
                records.extend(
                    PatchStatus(id=error.module, state=State.FAILED, detail="declaration module failed to load",
                                error=error.error)
                    for error in self._catalogue_errors
                )
            return records


#: The configuration problems already reported in this process: each is said once, however many
#: ``apply_all`` calls (autoload, a framework's plugin, the user's own) meet it.
_reported_problems: set[str] = set()


def report_config_problem(problem: ConfigError) -> None:
    """Say ``problem`` and what it costs, once per process: a ``PatchkitWarning`` attributed to the
    user's code (it reaches the user with no logging configured), and a debug record for logs."""
    message = f"patchkit: {problem} ({settings_module.consequence(problem)})"
    if first_time(message):
        logger.debug("%s", message)
        warn(message)


def first_time(message: str) -> bool:
    """Whether ``message`` is said for the first time in this process (and from now on, it was)."""
    if message in _reported_problems:
        return False
    _reported_problems.add(message)
    return True


def warn(message: str) -> None:
    """Issue a ``PatchkitWarning`` attributed to the first caller outside patchkit, so Python's
    default filter shows each distinct problem once per calling line, and users can filter it."""
    import warnings  # only when there is something to say: not imported at start-up

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    level, frame = 2, sys._getframe(1)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, PatchkitWarning, stacklevel=level)
