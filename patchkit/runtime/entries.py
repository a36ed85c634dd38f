"""What the engine holds for each patch, and the units of work one locked pass hands to the next step.

An :class:`Entry` is a patch's mutable record in one engine: its state and why, the variant chosen,
what is installed now, and the :class:`Ticket` of the thread installing it. Every field is read and
written under the engine's lock. A :class:`Work` collects what a locked pass decided (installs to
carry out, modules to watch) so that it is done after the lock is released.
"""

from __future__ import annotations

import threading

from . import installed, logs, settle
from .catalogue import Indexed, Registered
from .decision import Decision
from .errors import DeclarationError, DriftError, PatchInstallError
from .records import Record
from .settings import Settings
from .status import PatchStatus, Reason, State
from .versions import InstalledVersion, from_found

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:  # the installer is imported by the first install, not at start-up
    from .declaration import Patch, Variant  # types only: declarations are made when a patch needs one
    from .installer import Installed, Registration

logger = logs.get("patchkit")


#: What an entry holds before any apply call chose its settings (one for all: a catalogue has many entries).
_NO_SETTINGS = Settings()


class Ticket:
    """A claim on one patch's installation, held by the thread doing it (see :mod:`.engine`)."""

    __slots__ = ("thread",)

    def __init__(self) -> None:
        self.thread = threading.get_ident()


class Entry:
    """What the engine knows and holds for one patch (mutable, guarded by the engine's lock)."""

    __slots__ = ("id", "opt_in", "indexed", "_registered", "state", "reason", "detail", "variant", "versions",
                 "error", "waiting_for", "installed", "settings", "ticket", "undecided")

    def __init__(self, registered: Registered | Indexed) -> None:
        #: The catalogue index's record of a patch not made into a ``Patch`` yet (None once it is).
        self.indexed: Indexed | None
        self._registered: Registered | None
        if isinstance(registered, Indexed):
            self.id, self.opt_in = registered.id, registered.opt_in
            self.indexed, self._registered = registered, None
        else:
            self.id, self.opt_in = registered.patch.id, registered.patch.opt_in
            self.indexed, self._registered = None, registered
        self.state = State.REGISTERED
        self.reason: Reason | None = None
        self.detail = ""
        self.variant: Variant | None = None
        self.versions: dict[str, str | None] = {}
        self.error: str | None = None
        self.waiting_for: tuple[str, ...] = ()
        #: What is installed now. Non-empty in state FAILED too when a rollback could not undo a step:
        #: revert() retries it.
        self.installed: list[Installed | Registration] = []
        self.settings = _NO_SETTINGS
        self.ticket: Ticket | None = None
        #: Pending before any variant was chosen: waiting for any module one of its variants targets.
        self.undecided = False

    @property
    def registered(self) -> Registered:
        """The patch and where it resolves, made from the index's data on first use."""
        if self._registered is None:
            assert self.indexed is not None
            self._registered, self.indexed = self.indexed.registered(), None
        return self._registered

    @registered.setter
    def registered(self, registered: Registered) -> None:
        self._registered, self.indexed = registered, None

    @property
    def declared_in(self) -> str | None:
        """The declaration module this patch was read for from the index and that is not imported yet."""
        return self.indexed.declared_in if self.indexed is not None else self.registered.declared_in

    @property
    def patch(self) -> Patch:
        return self.registered.patch

    def set(self, state: State, reason: Reason | None = None, detail: str = "", error: str | None = None) -> None:
        self.state, self.reason, self.detail, self.error = state, reason, detail, error
        self.undecided = False
        if state is not State.PENDING:
            self.waiting_for = ()

    def fail(self, context: str, exc: BaseException) -> None:
        """Record (and log) that this patch failed ``context`` with ``exc``."""
        error = str(exc) if isinstance(exc, (DeclarationError, PatchInstallError, DriftError)) else repr(exc)
        self.set(State.FAILED, detail=context, error=error)
        logger.error("patchkit: %s failed %s: %s", self.id, context, error)

    def displaced(self) -> list[str]:
        """The targets of an installed patch that no longer hold its objects (see ``Installed.is_displaced``)."""
        if not self.state.installed or not self.installed:
            return []
        from .installer import Installed  # imported already: the install that filled the list used it

        return [item.target for item in self.installed if isinstance(item, Installed) and item.is_displaced()]

    def record(self) -> PatchStatus:
        variant = self.variant
        targets = tuple(str(t) for action in variant.installs for t in action.targets) if variant else ()
        state, reason, detail = self.state, self.reason, self.detail
        displaced = self.displaced() if self.installed else []
        if displaced:
            state, reason = State.DISPLACED, None
            detail = (f"no longer in effect at {', '.join(displaced)}: the module was reloaded or imported again "
                      f"after the patch was installed; apply_all() installs it again")
        return PatchStatus(
            id=self.id,
            state=state,
            reason=reason,
            detail=detail,
            variant=variant.name if variant else None,
            versions=dict(self.versions),
            error=self.error,
            targets=targets,
            waiting_for=self.waiting_for if self.state is State.PENDING else (),
        )


class Job(Record):
    """An installation decided under the lock, carried out by :func:`.jobs.carry_out`."""

    entry: Entry
    ticket: Ticket
    decision: Decision
    #: The module whose post-import hook decided it (still flagged as importing), if any.
    just_imported: str | None = None

    @property
    def variant(self) -> Variant:
        assert self.decision.variant is not None
        return self.decision.variant


class Work:
    """What one locked pass decided and must be done after releasing the lock, and the installed
    versions it read (once per distribution and pass: most patches of a family ask for the same one,
    and each answer costs a search of ``sys.path``)."""

    __slots__ = ("jobs", "watch", "versions", "found", "upstreams")

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.watch: list[str] = []
        self.versions: dict[tuple[str, str | None], InstalledVersion] = {}
        #: :func:`.installed.find`, read once in this pass.
        self.found = installed.Answers()
        self.upstreams: dict[tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]], settle.Upstream | None] = {}

    def upstream(self, distributions: tuple[tuple[str, str | None], ...],
                 required: tuple[str, ...]) -> settle.Upstream | None:
        """:func:`.settle.upstream`, settled once in this pass for all the patches of one upstream."""
        key = (distributions, required)
        if key not in self.upstreams:
            self.upstreams[key] = settle.upstream(distributions, required, self.found)
        return self.upstreams[key]

    def installed_version(self, distribution: str, module: str | None) -> InstalledVersion:
        """:func:`.versions.installed_version`, read once in this pass."""
        key = (distribution, module)
        version = self.versions.get(key)
        if version is None:
            version = self.versions[key] = from_found(*self.found(distribution, module), module)
        return version
