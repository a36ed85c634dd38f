"""The engine: decides, for each registered patch, what to do in this process, and does it.

One re-entrant lock guards all state, so ``apply_all``/``revert_all`` from many threads and import
hooks firing mid-call see a consistent registry. A patch moves through its states one at a time:

    registered -> skipped | pending -> applied | forced | failed | skipped(target_missing)
    applied | forced | pending -> reverted -> (considered again by the next apply)
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import logging
import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from . import gating
from . import settings as settings_module
from .catalogue import CatalogueError, Registered
from .declaration import Patch, Variant, validate
from .errors import (
    ConfigError,
    DeclarationError,
    DriftError,
    ForceRefusedError,
    ForeignWrapperError,
    PatchInstallError,
    TargetResolutionError,
    UnknownPatchError,
    UnsupportedVersionError,
)
from .installer import Installed, Registration, install_all, uninstall_all
from .settings import Settings
from .status import PatchStatus, Reason, State
from .versions import InstalledVersion, Outcome, installed_version, select_variant

if TYPE_CHECKING:  # the drift module is imported only when a patch installs
    from .drift import Drift, MatrixSource

logger = logging.getLogger("patchkit")


class _Entry:
    """What the engine knows and holds for one patch (mutable, guarded by the engine's lock)."""

    __slots__ = ("registered", "state", "reason", "detail", "variant", "versions", "error", "waiting_for",
                 "installed", "settings")

    def __init__(self, registered: Registered) -> None:
        self.registered = registered
        self.state = State.REGISTERED
        self.reason: Reason | None = None
        self.detail = ""
        self.variant: Variant | None = None
        self.versions: dict[str, str | None] = {}
        self.error: str | None = None
        self.waiting_for: tuple[str, ...] = ()
        self.installed: list[Installed | Registration] = []
        self.settings = Settings()

    @property
    def patch(self) -> Patch:
        return self.registered.patch

    def set(self, state: State, reason: Reason | None = None, detail: str = "", error: str | None = None) -> None:
        self.state, self.reason, self.detail, self.error = state, reason, detail, error
        if state is not State.PENDING:
            self.waiting_for = ()

    def record(self) -> PatchStatus:
        variant = self.variant
        targets = tuple(str(t) for action in variant.installs for t in action.targets) if variant else ()
        return PatchStatus(
            id=self.patch.id,
            state=self.state,
            reason=self.reason,
            detail=self.detail,
            variant=variant.name if variant else None,
            versions=dict(self.versions),
            error=self.error,
            targets=targets,
        )


class Engine:
    """A registry of patches and their state in this process.

    The module-level functions of :mod:`patchkit` use one engine loaded from the catalogue; tests
    and embedders may build their own from explicit ``Registered`` patches.
    """

    def __init__(self, patches: Iterable[Registered] = (), catalogue_errors: Iterable[CatalogueError] = (),
                 matrix: "MatrixSource" = None) -> None:
        self._lock = threading.RLock()
        #: Where drift fingerprints come from (see patchkit.runtime.drift.MatrixSource); read on first install.
        self._matrix = matrix
        self._entries: dict[str, _Entry] = {}
        self._catalogue_errors = tuple(catalogue_errors)
        self._strict = False
        for registered in patches:
            self.register(registered.patch, registered.package)
        _ENGINES.add(self)

    # -- registry -------------------------------------------------------------------------------

    def register(self, patch: Patch, package: str | None = None) -> None:
        """Add a patch. Its relative references resolve against ``package``."""
        with self._lock:
            validate(patch)
            if patch.id in self._entries:
                raise DeclarationError(f"patch id {patch.id!r} is registered twice")
            patch = patch._replace(variants=tuple(patch.variants), version_modules=dict(patch.version_modules))
            self._entries[patch.id] = _Entry(Registered(patch, package))
            self._entries = dict(sorted(self._entries.items()))

    def ids(self) -> list[str]:
        return list(self._entries)

    def patch(self, patch_id: str) -> Patch:
        return self._entry(patch_id, "patch id").patch

    def installed_actions(self, patch_id: str) -> tuple[Installed | Registration, ...]:
        """What a patch installed in this process (empty unless it is applied), newest last."""
        with self._lock:
            return tuple(self._entry(patch_id, "patch id").installed)

    def package(self, patch_id: str) -> str | None:
        """The package a patch's relative references (actions, self-check) resolve against."""
        return self._entry(patch_id, "patch id").registered.package

    def _entry(self, patch_id: str, variable: str) -> _Entry:
        entry = self._entries.get(patch_id)
        if entry is None:
            import difflib

            close = difflib.get_close_matches(patch_id, self.ids(), n=3, cutoff=0.5)
            raise UnknownPatchError(variable, patch_id, close)
        return entry

    # -- applying -------------------------------------------------------------------------------

    def apply_all(
        self,
        *,
        enable: Sequence[str] | str | None = None,
        disable: Sequence[str] | str | None = None,
        force: Sequence[str] | str | None = None,
        strict: bool | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> list[PatchStatus]:
        """Apply every patch that applies here; idempotent. Returns every patch's status.

        Explicit arguments override the ``PATCHKIT_*`` variables. A malformed toggle or an unknown
        id applies nothing (every patch is skipped with ``config_error``) unless strict, which raises.
        """
        with self._lock:
            chosen = self._settings(environ, enable=enable, disable=disable, force=force, strict=strict)
            if chosen is None:
                return self.status()
            for entry in self._entries.values():
                if not entry.state.installed and entry.state is not State.FAILED:
                    self._consider(entry, chosen)
            return self.status()

    def apply(self, *patterns: str, import_targets: bool = False, strict: bool | None = None,
              environ: Mapping[str, str] | None = None) -> list[PatchStatus]:
        """Apply the patches matching ``patterns`` (ids or globs), opt-in ones included.

        ``PATCHKIT_DISABLE`` still wins: it is the switch that turns a misbehaving patch off without a
        code change. With ``import_targets``, target modules are imported now so the patches install
        at once instead of waiting. Unknown ids raise ``UnknownPatchError``.
        """
        with self._lock:
            chosen = settings_module.from_environment(environ, enable=list(patterns), strict=strict)
            settings_module.check_known(chosen, self.ids())
            self._use(chosen)
            selected = [e for e in self._entries.values() if settings_module.matches_any(e.patch.id, patterns)]
            for entry in selected:
                if not entry.state.installed:
                    self._consider(entry, chosen)
            if import_targets:
                self._import_waiting(selected)
            return [entry.record() for entry in selected]

    @contextlib.contextmanager
    def applied(self, *patterns: str, strict: bool | None = None) -> Iterator[list[PatchStatus]]:
        """Apply ``patterns`` now (importing their targets) and revert on exit; for tests."""
        with self._lock:
            before = {pid for pid, e in self._entries.items() if e.state.installed or e.state is State.PENDING}
            records = self.apply(*patterns, import_targets=True, strict=strict)
        try:
            yield records
        finally:
            with self._lock:
                for record in records:
                    if record.id not in before:
                        self.revert(record.id)

    def import_targets(self) -> list[PatchStatus]:
        """Import the modules every pending patch waits for, so it installs now (``patchkit status``)."""
        with self._lock:
            self._import_waiting(list(self._entries.values()))
            return self.status()

    def _import_waiting(self, entries: Iterable[_Entry]) -> None:
        for entry in entries:
            for module in entry.waiting_for:
                if entry.state is State.PENDING and module not in sys.modules:
                    try:
                        importlib.import_module(module)
                    except Exception as exc:  # the upstream itself fails to import here
                        if self._strict:
                            raise
                        entry.set(State.FAILED, detail=f"importing {module} failed", error=repr(exc))
                        logger.error("patchkit: %s: importing %s failed: %r", entry.patch.id, module, exc)

    def _settings(self, environ: Mapping[str, str] | None, **explicit: Any) -> Settings | None:
        """Parse the toggles; on a bad value, raise if strict, else mark everything config_error."""
        try:
            chosen = settings_module.from_environment(environ, **explicit)
            for warning in settings_module.check_known(chosen, self.ids()):
                logger.warning("patchkit: %s", warning)
        except ConfigError as exc:
            if self._strict_despite_error(environ, explicit.get("strict")):
                raise
            logger.error("patchkit: nothing applied: %s", exc)
            for entry in self._entries.values():
                if not entry.state.installed and entry.state is not State.PENDING:
                    entry.set(State.SKIPPED, Reason.CONFIG_ERROR, str(exc))
            return None
        self._use(chosen)
        return chosen

    @staticmethod
    def _strict_despite_error(environ: Mapping[str, str] | None, explicit: bool | None) -> bool:
        if explicit is not None:
            return explicit
        try:
            env = os.environ if environ is None else environ
            return settings_module.parse_bool(settings_module.STRICT, env.get(settings_module.STRICT, ""))
        except ConfigError:
            return False

    def _use(self, chosen: Settings) -> None:
        self._strict = chosen.strict
        if chosen.log_level is not None:
            logger.setLevel(chosen.log_level)

    def _consider(self, entry: _Entry, chosen: Settings) -> None:
        patch = entry.patch
        entry.settings = chosen
        if not chosen.is_enabled(patch.id, patch.opt_in):
            reason = Reason.OPT_IN if patch.opt_in and chosen.enable is None else Reason.DISABLED
            why = "opt-in: enable with PATCHKIT_ENABLE" if reason is Reason.OPT_IN else "not in PATCHKIT_ENABLE"
            entry.set(State.SKIPPED, reason, why)
        elif chosen.is_disabled(patch.id):
            entry.set(State.SKIPPED, Reason.DISABLED, "disabled by PATCHKIT_DISABLE")
        else:
            self._advance_safely(entry, "while applying")

    def _advance_safely(self, entry: _Entry, context: str, just_imported: str | None = None) -> None:
        """``_advance``, with anything unexpected recorded as a failure of this patch alone."""
        try:
            self._advance(entry, just_imported)
        except Exception as exc:
            if entry.settings.strict:
                raise
            entry.set(State.FAILED, detail=context, error=str(exc) if isinstance(exc, DeclarationError) else repr(exc))
            logger.error("patchkit: %s failed %s: %r", entry.patch.id, context, exc)

    def _advance(self, entry: _Entry, just_imported: str | None = None) -> None:
        """Take ``entry`` as far as the installed upstreams and imported modules allow.

        ``just_imported`` is the module whose post-import hook is running: it has finished executing
        though Python still flags it as initialising until the hook returns.
        """
        patch = entry.patch
        found: dict[str, InstalledVersion] = {
            dist: installed_version(dist, patch.version_modules.get(dist)) for dist in patch.distributions
        }
        entry.versions = {dist: v.raw for dist, v in found.items()}
        selection = select_variant(patch, found)
        forced = False
        if selection.outcome is Outcome.NOT_INSTALLED:
            entry.set(State.SKIPPED, Reason.NOT_INSTALLED, selection.detail)
            logger.debug("patchkit: %s skipped: %s", patch.id, selection.detail)
            return
        if selection.outcome is Outcome.DEFERRED:
            self._wait(entry, selection.waiting_for, selection.detail)
            return
        forced_native = gating.native_refusal(patch, found, selection) if entry.settings.is_forced(patch.id) else None
        if forced_native is not None:
            refused = ForceRefusedError(patch.id, entry.versions, forced_native.name,
                                        forced_native.native or "native")
            if entry.settings.strict:
                raise refused
            entry.variant = forced_native
            entry.set(State.SKIPPED, Reason.NATIVE, forced_native.native or "native", error=str(refused))
            logger.error("patchkit: %s", refused)
            return
        identical = None
        if selection.outcome is Outcome.UNSUPPORTED:
            nearest = selection.nearest
            if entry.settings.is_forced(patch.id) and nearest is not None:
                forced = True
                entry.variant = nearest
            elif nearest is not None and gating.identity_applies(patch, found, selection):
                # A release past every range: the nearest variant applies if its code is identical,
                # which can be read only once its modules are imported (patchkit never imports them).
                blocker = gating.identity_blocker(patch, nearest, self._matrix, entry.settings.strict)
                if blocker is not None:
                    self._unsupported(entry, f"{selection.detail}; not code-identical: {blocker}", blocker)
                    return
                missing = tuple(m for m in nearest.modules if m != just_imported and not _imported(m))
                if missing:
                    self._wait(entry, missing, f"{selection.detail}; its code is compared with variant "
                                               f"{nearest.name} once {', '.join(missing)} is imported")
                    return
                identity = gating.identity(patch, nearest, self._matrix, entry.settings.strict)
                if not identity.identical:
                    self._unsupported(entry, f"{selection.detail}; not code-identical: {identity.detail}",
                                      identity.detail)
                    return
                identical = (f"code identical: {selection.detail}, but every target of variant {nearest.name} "
                             f"is code it was verified on: {identity.detail}")
                entry.variant = nearest
            else:
                self._unsupported(entry, selection.detail)
                return
        else:
            entry.variant = selection.variant
        variant = entry.variant
        assert variant is not None
        if variant.native is not None:
            entry.set(State.SKIPPED, Reason.NATIVE, variant.native)
            logger.info("patchkit: %s not needed: %s", patch.id, variant.native)
            return
        missing = tuple(m for m in variant.modules if m != just_imported and not _imported(m))
        if missing:
            self._wait(entry, missing, f"waiting for {', '.join(missing)} to be imported")
            return
        self._install(entry, variant, forced, selection.detail, identical)

    def _unsupported(self, entry: _Entry, detail: str, identity_detail: str = "") -> None:
        patch = entry.patch
        if entry.settings.strict:
            raise UnsupportedVersionError(patch.id, entry.versions, (v.name for v in patch.variants),
                                          detail=identity_detail)
        entry.set(State.SKIPPED, Reason.UNSUPPORTED_VERSION, detail)
        logger.warning("patchkit: %s skipped: %s", patch.id, detail)

    def _install(self, entry: _Entry, variant: Variant, forced: bool, unsupported_detail: str,
                 identical: str | None = None) -> None:
        patch = entry.patch
        # A forced variant is already outside its verified range; drift would only say so again. A
        # code-identical one was just compared with every record.
        drift = None if forced or identical else self._drift(entry, variant)
        try:
            entry.installed = install_all(patch.id, variant.installs, entry.registered.package)
        except TargetResolutionError as exc:
            if entry.settings.strict:
                raise
            entry.set(State.SKIPPED, Reason.TARGET_MISSING, str(exc))
            logger.warning("patchkit: %s skipped (variant %s): %s", patch.id, variant.name, exc)
        except PatchInstallError as exc:
            if entry.settings.strict:
                raise
            entry.set(State.FAILED, detail=f"variant {variant.name}", error=str(exc))
            logger.error("patchkit: %s", exc)
        else:
            if forced:
                entry.set(State.FORCED, Reason.UNSUPPORTED_VERSION, f"forced: {unsupported_detail}")
                logger.warning("patchkit: %s applied by force (variant %s): %s", patch.id, variant.name,
                               unsupported_detail)
            elif identical is not None:
                entry.set(State.APPLIED, Reason.CODE_IDENTICAL, identical)
                logger.warning("patchkit: %s applied (variant %s): %s", patch.id, variant.name, identical)
            elif drift is not None:
                entry.set(State.APPLIED, Reason.DRIFTED, drift.detail)
                logger.warning("patchkit: %s applied (variant %s), but %s", patch.id, variant.name, drift.detail)
            else:
                entry.set(State.APPLIED)
                logger.info("patchkit: %s applied (variant %s)", patch.id, variant.name)

    def _drift(self, entry: _Entry, variant: Variant) -> "Drift | None":
        """Compare the targets with compat_matrix.yaml; strict mode refuses a drifted variant."""
        from . import drift

        try:
            found = drift.check(entry.patch.id, variant, self._matrix, strict=entry.settings.strict)
        except Exception as exc:  # the check itself broke: drift is unknown, the patch still applies
            if entry.settings.strict:
                raise
            logger.warning("patchkit: %s: drift check unavailable, applying unchecked: %r", entry.patch.id, exc)
            return None
        if found is not None and entry.settings.strict:
            raise DriftError(found.patch_id, found.variant, found.targets, found.compared)
        return found

    def _wait(self, entry: _Entry, modules: tuple[str, ...], detail: str) -> None:
        # The state is set before the hooks: a hook may fire at once (the module was imported
        # meanwhile) and must find the entry already pending.
        entry.set(State.PENDING, None, detail)
        entry.waiting_for = modules
        for module in modules:
            _watch(module)

    def _module_imported(self, module: str) -> None:
        """Post-import hook: advance every patch that was waiting for ``module``."""
        with self._lock:
            for entry in self._entries.values():
                if entry.state is State.PENDING and module in entry.waiting_for:
                    self._advance_safely(entry, f"on import of {module}", just_imported=module)

    # -- reverting ------------------------------------------------------------------------------

    def revert(self, patch_id: str) -> PatchStatus:
        """Restore the originals of one patch. Raises ``ForeignWrapperError`` if another wrapper
        sits on top of patchkit's (the patch then stays applied)."""
        with self._lock:
            entry = self._entry(patch_id, "patch id")
            if entry.state.installed:
                try:
                    uninstall_all(entry.patch.id, entry.installed)
                except ForeignWrapperError as exc:
                    entry.reason, entry.detail = Reason.FOREIGN_WRAPPER, str(exc)
                    raise
                entry.set(State.REVERTED, detail="originals restored")
                logger.info("patchkit: %s reverted", patch_id)
            elif entry.state is State.PENDING:
                entry.set(State.REVERTED, detail="no longer waiting for import")
            return entry.record()

    def revert_all(self) -> list[PatchStatus]:
        """Revert every patch that can be; refused ones stay applied and say why in their status."""
        with self._lock:
            for patch_id in reversed(self.ids()):
                try:
                    self.revert(patch_id)
                except ForeignWrapperError as exc:
                    if self._strict:
                        raise
                    logger.error("patchkit: %s", exc)
            return self.status()

    # -- reporting ------------------------------------------------------------------------------

    def status(self, *patterns: str) -> list[PatchStatus]:
        """Every patch's status (or those matching ``patterns``), sorted by id."""
        with self._lock:
            records = [
                entry.record() for entry in self._entries.values()
                if not patterns or any(fnmatch.fnmatchcase(entry.patch.id, p) for p in patterns)
            ]
            if not patterns:
                records.extend(
                    PatchStatus(id=error.module, state=State.FAILED, detail="declaration module failed to load",
                                error=error.error)
                    for error in self._catalogue_errors
                )
            return records


# -- post-import hooks ----------------------------------------------------------------------------
# Post-import hooks (patchkit.runtime.hooks) fire once and cannot be unregistered, so at most one
# is armed per module name; it
# dispatches to whichever engines are alive, and each engine ignores modules it no longer waits for.

_ENGINES: "weakref.WeakSet[Engine]" = weakref.WeakSet()
_ARMED: set[str] = set()
_WATCH_LOCK = threading.RLock()  # hooks may fire the hook at once, from inside _watch


def _imported(module: str) -> bool:
    """In ``sys.modules`` and done executing. A module that imports another target module is in
    ``sys.modules`` while it still runs: installing then would find its attributes missing."""
    found = sys.modules.get(module)
    return found is not None and not getattr(getattr(found, "__spec__", None), "_initializing", False)


def _watch(module: str) -> None:
    with _WATCH_LOCK:
        if module in _ARMED:
            return
        if module in sys.modules and not _imported(module):
            # Its import began before any hook was armed, so none will fire when it ends; the
            # patch stays pending until the next import it waits for, or import_targets().
            logger.debug("patchkit: %s is still being imported; cannot hook it now", module)
            return
        if module not in sys.modules:
            _ARMED.add(module)
            from . import hooks

            # hooks calls it at once, outside this lock, if the module got imported meanwhile.
            hooks.register(module, _on_import)
            return
    _dispatch(module)


def _on_import(module: Any) -> None:
    with _WATCH_LOCK:
        _ARMED.discard(module.__name__)
    _dispatch(module.__name__)


def _dispatch(module: str) -> None:
    """Never let a patch break the user's import, unless strict mode asked for exactly that."""
    for engine in list(_ENGINES):
        try:
            engine._module_imported(module)
        except Exception:
            if engine._strict:
                raise
            logger.exception("patchkit: post-import hook for %s failed", module)
