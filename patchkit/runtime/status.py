"""What happened to each patch, as structured, JSON-serialisable records."""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType

from .records import Record

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Any, Mapping


class State(str, Enum):
    REGISTERED = "registered"  #: known, not yet asked for
    APPLIED = "applied"
    FORCED = "forced"  #: applied outside its verified range, because PATCHKIT_FORCE asked
    PENDING = "pending"  #: waiting for a target module to be imported
    SKIPPED = "skipped"
    FAILED = "failed"
    REVERTED = "reverted"
    #: Installed, but a target no longer holds patchkit's object although nothing reverted it: its
    #: module was reloaded (``importlib.reload``) or imported anew. ``apply_all()`` installs it again.
    DISPLACED = "displaced"

    @property
    def installed(self) -> bool:
        # By identity: asked several times per patch and pass, and an enum's == and hash run Python code.
        return self is _APPLIED or self is _FORCED


_APPLIED, _FORCED = State.APPLIED, State.FORCED


class Reason(str, Enum):
    NOT_INSTALLED = "not_installed"
    UNSUPPORTED_VERSION = "unsupported_version"
    NATIVE = "native"
    DISABLED = "disabled"
    OPT_IN = "opt_in"
    TARGET_MISSING = "target_missing"
    CONFIG_ERROR = "config_error"
    #: Reported with state APPLIED when a revert was refused.
    FOREIGN_WRAPPER = "foreign_wrapper"
    #: Reported with state APPLIED when a target's code matches no fingerprint in compat_matrix.yaml.
    DRIFTED = "drifted"
    #: Reported with state APPLIED for a release beyond every verified range whose patched code is
    #: identical to code the variant was verified on (every target's fingerprint is a recorded one).
    CODE_IDENTICAL = "code_identical"


class PatchStatus(Record):
    """One patch's state in this process."""

    id: str
    state: State
    reason: Reason | None = None
    detail: str = ""
    variant: str | None = None
    versions: Mapping[str, str | None] = MappingProxyType({})
    error: str | None = None
    targets: tuple[str, ...] = ()
    #: For a pending patch, the modules whose import it waits for.
    waiting_for: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
            "reason": self.reason.value if self.reason else None,
            "detail": self.detail,
            "variant": self.variant,
            "versions": dict(self.versions),
            "error": self.error,
            "targets": list(self.targets),
            "waiting_for": list(self.waiting_for),
        }
