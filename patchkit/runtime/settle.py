"""What the catalogue's index alone settles about a patch, before its declaration is read.

A patch read from the index is switched off (``PATCHKIT_ENABLE``/``DISABLE``, opt-in), or its
upstream is not installed (skipped), or its upstream is installed and none of the modules its
variants install into is imported yet (pending, *undecided*: its variant is chosen when one of them
is imported). Anything else needs the whole decision (:mod:`.decision`). The engine asks here first
for every patch of the index (:meth:`.engine.Engine._consider`), and so does the start-up pass of a
process that has no engine yet (:mod:`.process_engine`): the same answers, from one place.

Nothing here reads a declaration, parses a version or imports an upstream: this is what keeps
start-up flat in the size of the catalogue.
"""

from __future__ import annotations

from .installed import MISSING
from .records import Record
from .settings import OPT_IN
from .status import Reason, State

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Callable

    from .settings import Settings

    #: (distribution, its import package or None) -> what :func:`.installed.find` answers.
    Finder = Callable[[str, "str | None"], tuple[str, "str | None"]]


class Settled(Record):
    """A patch's state as the index settles it: skipped (``not_installed``), or pending undecided."""

    state: State
    reason: Reason | None
    detail: str
    #: Each distribution's version as its metadata spells it (None: not installed).
    versions: dict[str, str | None]
    #: For a pending patch: the modules any of its variants installs into; one imported decides it.
    waiting_for: tuple[str, ...] = ()


def switched_off(patch_id: str, opt_in: bool, settings: Settings) -> tuple[Reason, str] | None:
    """The reason and detail of a patch that ``settings`` switch off (needs no fact), or None."""
    if not settings.is_enabled(patch_id, opt_in):
        if opt_in:
            return Reason.OPT_IN, f"opt-in: enable with {OPT_IN}={patch_id}"
        return Reason.DISABLED, "not in PATCHKIT_ENABLE"
    if settings.is_disabled(patch_id):
        return Reason.DISABLED, "disabled by PATCHKIT_DISABLE"
    return None


def from_index(distributions: tuple[tuple[str, str | None], ...], modules: tuple[str, ...],
               required: tuple[str, ...], find: Finder, imported: Callable[[str], bool]) -> Settled | None:
    """Settle a patch from its index record (its distributions with their import packages, the
    modules whose import decides it: :func:`.catalogue.indexed_summary`, the distributions every
    variant requires), or None if it needs the whole decision.

    Its upstream not installed (or a distribution every variant requires): skipped. Installed, none
    of ``modules`` imported yet: pending, undecided, until one is. A patch whose every variant is
    native installs into no module: it waits for its upstream's import package instead. Anything
    else (a target module imported, no module to wait for, a version known only once imported, an
    upstream installed in part that some variant may do without) is for the decision. Versions are
    not parsed here: one that does not parse is reported by the decision once the upstream is
    imported, like a version outside every range.
    ``find`` is :func:`.installed.find` (or a cache of it); ``imported`` says whether a module has
    finished importing.
    """
    versions: dict[str, str | None] = {}
    absent: list[str] = []
    for dist, module in distributions:
        availability, raw = find(dist, module)
        if availability == MISSING:
            absent.append(dist)
            continue
        if raw is None:
            return None  # deferred: the version is read once the module is imported
        versions[dist] = raw
    if absent:
        if not any(dist in required for dist in absent) and len(absent) < len(distributions):
            return None  # installed in part, and some variant may not need what is missing: for the decision
        return Settled(State.SKIPPED, Reason.NOT_INSTALLED, f"{', '.join(sorted(absent))} not installed",
                       {dist: versions.get(dist) for dist, _ in distributions})
    waiting = modules or tuple(module for _, module in distributions if module is not None)
    if not waiting or any(imported(module) for module in waiting):
        return None  # nothing to wait for, or a module is here: decided now
    return Settled(State.PENDING, None, f"waiting for {' or '.join(waiting)} to be imported; its variant is "
                                        f"chosen then", versions, waiting)
