"""Carrying out the installs a locked pass claimed, and giving up the claims of an interrupted pass.

A claimed install (a :class:`~.entries.Job`) is done in two steps: without the engine's lock, import
what the variant references and check drift (step 2 of the engine's three, see :mod:`.engine`);
then under the lock again, if the claim still holds, set the attributes and record the outcome
(step 3). A pass that an exception interrupts (a ``KeyboardInterrupt``, a signal handler that
raises, ``sys.exit`` in a hook) rolls back each install it still holds a claim on (:func:`abandon`).
"""

from __future__ import annotations

from . import catalogue, import_watch, interrupts, logs
from .catalogue import Registered
from .decision import Decision
from .entries import Entry, Job, Work
from .errors import DeclarationError, DriftError, PatchInstallError, TargetResolutionError
from .status import Reason, State

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:  # the drift module is imported only when a patch installs
    from .declaration import Patch, Variant  # types only: declarations are made when a patch needs one
    from .drift import Drift
    from .engine import Engine
    from .installer import Prepared

logger = logs.get("patchkit")


def carry_out_all(engine: "Engine", work: Work) -> None:
    """Do what a locked pass decided, without the lock; raise the first strict-mode error after
    every job ran (one patch's strict failure does not leave another one half-decided)."""
    first: BaseException | None = None
    for job in work.jobs:
        try:
            carry_out(engine, job)
        except Exception as exc:
            first = first or exc
    import_watch.watch(work.watch)
    if first is not None:
        raise first


def carry_out(engine: "Engine", job: Job) -> None:
    """Install one claimed patch: imports and drift without the lock, attributes under it."""
    from .installer import prepare_all  # here, not at the top: a pass that installs nothing never needs it

    entry = job.entry
    if entry.registered.declared_in is not None and not confirm_declaration(engine, job):
        return
    variant, patch = job.variant, entry.patch
    try:
        drift = check_drift(engine, entry, variant) if job.decision.checks_drift else None
        prepared = prepare_all(patch.id, variant.installs, entry.registered.package)
    except Exception as exc:
        with engine._lock:
            if entry.ticket is not job.ticket:
                return  # reverted meanwhile: nothing was installed
            entry.ticket = None
            install_failed(entry, variant, exc)
        if entry.settings.strict:
            raise
        return
    with engine._lock, interrupts.deferred():
        if entry.ticket is not job.ticket:
            return  # reverted or re-decided meanwhile
        error = install(entry, job.decision, prepared, drift)
        entry.ticket = None  # last: until here, an interruption is undone by abandon()
    if error is not None:
        raise error


def confirm_declaration(engine: "Engine", job: Job) -> bool:
    """Before the first install of a patch read from the catalogue's index, import its declaration
    module (without the lock) and check the index said what it declares; True: install as decided.

    A declaration that differs (the index is stale) replaces the index's copy, with a warning, and
    the patch is decided again from it; one that is gone or fails to load fails the patch. Either
    way this job is given up, so nothing is installed from data the declaration does not hold.
    """
    entry, module = job.entry, job.entry.registered.declared_in
    assert module is not None
    problem: Exception | None
    try:
        declared: Patch | None = catalogue.declared(module, entry.patch.id)
        problem = None if declared is not None else DeclarationError(
            f"{module} no longer declares {entry.patch.id} (the catalogue's index is stale: regenerate it with "
            f"`patchkit matrix catalogue`)")
    except Exception as exc:
        declared, problem = None, exc
    with engine._lock:
        if entry.ticket is not job.ticket:
            return False  # reverted meanwhile
        if declared == entry.patch:
            entry.registered = entry.registered._replace(declared_in=None)
            return True
        entry.ticket = None
        if declared is None:
            entry.fail(f"loading its declaration module {module}", problem or DeclarationError(module))
        else:
            logger.warning("patchkit: %s: %s declares it otherwise than the catalogue's index (stale: regenerate "
                           "it with `patchkit matrix catalogue`); deciding again from the declaration",
                           entry.patch.id, module)
            entry.registered = Registered(declared, entry.registered.package)
    if declared is None:
        if entry.settings.strict:
            raise problem or DeclarationError(module)
        return False
    engine._decide_again(entry, f"after loading {module}", job.just_imported)
    return False


def install_failed(entry: Entry, variant: "Variant", exc: Exception) -> None:
    """Record why ``variant`` did not install (under the lock); the caller raises if strict."""
    patch = entry.patch
    if isinstance(exc, TargetResolutionError):
        entry.set(State.SKIPPED, Reason.TARGET_MISSING, str(exc))
        logger.warning("patchkit: %s skipped (variant %s): %s", patch.id, variant.name, exc)
    elif isinstance(exc, PatchInstallError):
        entry.installed = list(exc.leftovers)  # what the rollback could not undo: revert() retries it
        entry.set(State.FAILED, detail=f"variant {variant.name}", error=str(exc))
        logger.error("patchkit: %s", exc)
    elif isinstance(exc, DriftError):
        entry.set(State.FAILED, Reason.DRIFTED, f"variant {variant.name} refused in strict mode",
                  error=str(exc))
        logger.error("patchkit: %s", exc)
    else:
        entry.fail(f"variant {variant.name}", exc)


def install(entry: Entry, decision: Decision, prepared: list[Prepared], drift: "Drift | None") -> Exception | None:
    """Set the attributes and record the outcome (under the lock); returns the error strict mode raises.

    ``entry.installed`` is filled in place as each attribute is set, so an interruption at any
    point leaves a record of exactly what is installed (see :func:`abandon`).
    """
    from .installer import install_all  # imported already by carry_out

    patch, variant = entry.patch, decision.variant
    assert variant is not None
    try:
        install_all(patch.id, prepared, entry.installed)
    except Exception as exc:
        install_failed(entry, variant, exc)
        return exc if entry.settings.strict else None
    if decision.reason is None and drift is not None:
        entry.set(State.APPLIED, Reason.DRIFTED, drift.detail)
        logger.warning("patchkit: %s applied (variant %s), but %s", patch.id, variant.name, drift.detail)
        return None
    entry.set(decision.state, decision.reason, decision.detail)
    if decision.state is State.FORCED:
        logger.warning("patchkit: %s applied by force (variant %s): %s", patch.id, variant.name,
                       decision.detail.removeprefix("forced: "))
    elif decision.reason is not None:
        logger.warning("patchkit: %s applied (variant %s): %s", patch.id, variant.name, decision.detail)
    else:
        logger.info("patchkit: %s applied (variant %s)", patch.id, variant.name)
    return None


def abandon(engine: "Engine", work: Work) -> None:
    """Undo what an interrupted pass left half-done (a ``KeyboardInterrupt``, a SIGTERM handler
    that raised, ``sys.exit`` in a hook): each patch it still holds a claim on is rolled back to
    what it was before the claim, unless it was completely installed and recorded already, and
    the claim is released, so the next ``apply_all`` considers it again."""
    with interrupts.deferred(), engine._lock:
        for job in work.jobs:
            entry = job.entry
            if entry.ticket is not job.ticket:
                continue  # carried out (or cancelled by a revert) already
            if not entry.state.installed and entry.installed:
                from .installer import rollback  # imported already: something was installed

                failures = rollback(entry.installed)
                if failures:  # what cannot be undone stays recorded: revert() retries it
                    entry.set(State.FAILED, detail=f"variant {job.variant.name}: interrupted",
                              error="; ".join(f"{where}: {error!r}" for where, error in failures))
            entry.ticket = None


def check_drift(engine: "Engine", entry: Entry, variant: "Variant") -> "Drift | None":
    """Compare the targets with the recorded fingerprints; strict mode refuses a drifted variant."""
    from . import drift

    try:
        found = drift.check(entry.patch.id, variant, engine.matrix, strict=entry.settings.strict)
    except Exception as exc:  # the check itself broke: drift is unknown, the patch still applies
        if entry.settings.strict:
            raise
        logger.warning("patchkit: %s: drift check unavailable, applying unchecked: %r", entry.patch.id, exc)
        return None
    if found is not None and entry.settings.strict:
        raise DriftError(found.patch_id, found.variant, found.targets, found.compared)
    return found
