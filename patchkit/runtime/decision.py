"""What one patch should do in this process: a pure decision, apart from the machinery that acts on it.

:func:`decide` takes a declaration, the settings of this ``apply`` call and the facts found in the
process (installed versions, which modules are imported, what the records say about code
identity) and answers which variant, which state and why. It imports nothing, takes no lock,
changes no state and logs nothing: the engine (:mod:`.engine`) gathers the facts, records the
decision, imports what it names and installs. :func:`next_step` says, from a patch's current
state, whether an ``apply_all``/``apply`` call or an import is a reason to decide again at all.

The facts that cost something (reading records, fingerprinting installed code) are callables, so
they are paid for only on the path that needs them; a table of cases drives them with plain
values (tests/engine/test_decisions.py).
"""

from __future__ import annotations

from enum import Enum

from . import gating, settle
from .errors import ForceRefusedError, PatchkitError, UnsupportedVersionError
from .records import Record
from .settings import Settings
from .status import Reason, State
from .versions import Outcome, select_variant

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Callable, Mapping

    from .declaration import Patch, Variant  # types only: declarations are made when a patch needs one
    from .drift import Identity  # the drift check is imported only where a patch installs
    from .versions import InstalledVersion


class Facts(Record):
    """What the decision needs to know about this process."""

    #: distribution -> its installed version, for every distribution the patch names.
    versions: Mapping[str, InstalledVersion]
    #: Whether a module has finished importing (the one whose post-import hook runs counts as done).
    imported: Callable[[str], bool]
    #: Why code identity cannot hold for a variant, known before any upstream import; None: worth reading.
    identity_blocker: Callable[[Variant], "str | None"]
    #: The comparison of a variant's targets, once imported, with their records.
    identity: Callable[[Variant], "Identity"]


class Decision(Record):
    """Which state a patch takes, why, and with which variant.

    ``state`` is ``SKIPPED``, ``PENDING`` (waiting for ``waiting_for`` to be imported), or
    ``APPLIED``/``FORCED``: install ``variant`` (the reason and detail are then what the status says
    once it is installed, unless the drift check at install time has something to say).
    """

    state: State
    reason: Reason | None = None
    detail: str = ""
    #: The variant the status names from now on; None: the one named before stays.
    variant: Variant | None = None
    waiting_for: tuple[str, ...] = ()
    #: What the status records as its error (a refusal to force a native patch).
    error: str | None = None
    #: The typed error strict mode raises once the decision is recorded.
    refusal: PatchkitError | None = None

    @property
    def installs(self) -> bool:
        return self.state.installed

    @property
    def checks_drift(self) -> bool:
        """Whether the install compares the targets with their records first: not for a forced
        variant (outside its verified range already: drift would only say so again) nor a
        code-identical one (just compared with every record)."""
        return self.state is State.APPLIED and self.reason is not Reason.CODE_IDENTICAL


def decide(patch: Patch, settings: Settings, facts: Facts) -> Decision:
    """Decide what ``patch`` does here. Raises ``DeclarationError`` for overlapping variants (a
    malformed declaration), and whatever the ``facts`` callables raise."""
    off = switched_off(patch, settings)
    if off is not None:
        return off
    versions = facts.versions
    selection = select_variant(patch, versions)
    if selection.outcome is Outcome.NOT_INSTALLED:
        return Decision(State.SKIPPED, Reason.NOT_INSTALLED, selection.detail)
    if selection.outcome is Outcome.DEFERRED:
        return Decision(State.PENDING, detail=selection.detail, waiting_for=selection.waiting_for)

    raw = {dist: found.raw for dist, found in versions.items()}
    forced = settings.is_forced(patch.id)
    native = gating.native_refusal(patch, versions, selection) if forced else None
    if native is not None:
        why = native.native or "native"
        refused = ForceRefusedError(patch.id, raw, native.name, why)
        return Decision(State.SKIPPED, Reason.NATIVE, why, variant=native, error=str(refused), refusal=refused)

    def unsupported(detail: str, identity_detail: str = "") -> Decision:
        refusal = UnsupportedVersionError(patch.id, raw, (v.name for v in patch.variants), detail=identity_detail)
        return Decision(State.SKIPPED, Reason.UNSUPPORTED_VERSION, detail, refusal=refusal)

    if selection.outcome is Outcome.SELECTED:
        assert selection.variant is not None
        return _install(selection.variant, facts, Decision(State.APPLIED, variant=selection.variant))
    nearest = selection.nearest
    if nearest is None:
        return unsupported(selection.detail)
    if forced:
        return _install(nearest, facts, Decision(State.FORCED, Reason.UNSUPPORTED_VERSION,
                                                 f"forced: {selection.detail}", variant=nearest))
    if not gating.identity_applies(patch, versions, selection):
        return unsupported(selection.detail)
    # A release past every range: the nearest variant applies if its code is identical, which can be
    # read only once its modules are imported (patchkit never imports them to find out).
    blocker = facts.identity_blocker(nearest)
    if blocker is not None:
        return unsupported(f"{selection.detail}; not code-identical: {blocker}", blocker)
    missing = tuple(m for m in nearest.modules if not facts.imported(m))
    if missing:
        return Decision(State.PENDING, detail=f"{selection.detail}; its code is compared with variant "
                                              f"{nearest.name} once {', '.join(missing)} is imported",
                        waiting_for=missing)
    identity = facts.identity(nearest)
    if not identity.identical:
        return unsupported(f"{selection.detail}; not code-identical: {identity.detail}", identity.detail)
    return Decision(State.APPLIED, Reason.CODE_IDENTICAL,
                    f"code identical: {selection.detail}, but every target of variant {nearest.name} "
                    f"is code it was verified on: {identity.detail}", variant=nearest)


def switched_off(patch: Patch, settings: Settings) -> Decision | None:
    """The skip that ``PATCHKIT_ENABLE``/``PATCHKIT_DISABLE`` (or opt-in) decide, or None. The first
    step of :func:`decide`, on its own because it needs no facts: a switched-off patch costs nothing."""
    return switched_off_id(patch.id, patch.opt_in, settings)


def switched_off_id(patch_id: str, opt_in: bool, settings: Settings) -> Decision | None:
    """:func:`switched_off` from the patch's id and ``opt_in`` alone (what the catalogue's index holds)."""
    off = settle.switched_off(patch_id, opt_in, settings)
    return None if off is None else Decision(State.SKIPPED, *off)


def _install(variant: Variant, facts: Facts, install: Decision) -> Decision:
    """``install``, unless upstream does it natively or the variant's modules are not imported yet
    (the status then names ``variant`` already)."""
    if variant.native is not None:
        return Decision(State.SKIPPED, Reason.NATIVE, variant.native, variant=variant)
    missing = tuple(m for m in variant.modules if not facts.imported(m))
    if missing:
        return Decision(State.PENDING, detail=f"waiting for {', '.join(missing)} to be imported",
                        variant=variant, waiting_for=missing)
    return install


class Trigger(Enum):
    """What makes the engine look at a patch again."""

    APPLY_ALL = "apply_all"
    #: ``apply(pattern)``: asked for by name, so a failed patch is tried again.
    APPLY = "apply"
    #: The post-import hook of a module the patch waits for.
    IMPORT = "import"


class Step(Enum):
    LEAVE = "leave"  #: nothing to decide: installed, failed, claimed by an install in progress, ...
    DECIDE = "decide"
    #: Installed but displaced (its module reloaded): restore what it still holds, then decide again.
    REINSTALL = "reinstall"


def next_step(state: State, trigger: Trigger, *, claimed: bool, displaced: bool = False) -> Step:
    """Whether ``trigger`` is a reason to decide again for a patch in ``state``.

    ``claimed``: another pass holds the patch's install (it decided already). ``displaced``: an
    installed patch's targets no longer hold its objects. For :attr:`Trigger.IMPORT`, the caller
    asks only for patches that wait for the imported module.
    """
    if claimed:
        return Step.LEAVE
    if state.installed:
        return Step.REINSTALL if displaced and trigger is Trigger.APPLY_ALL else Step.LEAVE
    if trigger is Trigger.IMPORT:
        return Step.DECIDE if state is State.PENDING else Step.LEAVE
    if trigger is Trigger.APPLY_ALL and state is State.FAILED:
        return Step.LEAVE  # what failed stays failed until asked for by name (apply) or reverted
    return Step.DECIDE
