"""Typed errors. Each subclasses what a caller would already catch for that kind of mistake."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping, Sequence


class PatchkitError(Exception):
    """Base class of every error patchkit raises on purpose."""


class DeclarationError(PatchkitError, ValueError):
    """A patch declaration is malformed (bad id, bad target path, overlapping variants)."""


class ConfigError(PatchkitError, ValueError):
    """A ``PATCHKIT_*`` variable or an explicit argument has a value patchkit cannot read."""

    def __init__(self, variable: str, value: str, accepted: str, problem: str = "malformed") -> None:
        self.variable = variable
        self.value = value
        self.accepted = accepted
        super().__init__(f"{variable}={value!r} is {problem}; accepted: {accepted}")


class UnknownPatchError(ConfigError, LookupError):
    """A patch id named in a toggle or an API call is not in the registry."""

    def __init__(self, variable: str, patch_id: str, suggestions: Sequence[str]) -> None:
        self.patch_id = patch_id
        self.suggestions = tuple(suggestions)
        hint = f"did you mean {', '.join(self.suggestions)}?" if self.suggestions else "see `patchkit list`"
        super().__init__(variable, patch_id, f"a known patch id or glob ({hint})", problem="not a known patch id")


class UnsupportedVersionError(PatchkitError):
    """The installed upstream matches none of a patch's variants (raised in strict mode only)."""

    def __init__(self, patch_id: str, versions: dict[str, str | None], supported: Iterable[str],
                 detail: str = "") -> None:
        self.patch_id = patch_id
        self.versions = versions
        self.supported = tuple(supported)
        #: Why code identity did not apply, naming the target (for a release beyond every range).
        self.detail = detail
        found = ", ".join(f"{dist} {ver}" for dist, ver in versions.items())
        why = f"; not code-identical: {detail}" if detail else ""
        super().__init__(
            f"{patch_id}: installed {found} is outside every verified range ({'; '.join(self.supported)}){why}; "
            f"set PATCHKIT_FORCE={patch_id} to apply the nearest variant anyway, or PATCHKIT_DISABLE={patch_id}"
        )


class TargetResolutionError(PatchkitError, AttributeError):
    """A ``module:Qualname.attr`` path does not resolve: upstream moved or removed the symbol."""

    def __init__(self, path: str, missing: str) -> None:
        self.path = path
        self.missing = missing
        super().__init__(f"cannot resolve {path}: {missing}")


class PatchkitWarning(UserWarning):
    """A problem that disabled patches, shown even where no logging is configured.

    Filter it like any warning: ``warnings.filterwarnings("ignore", category=patchkit.PatchkitWarning)``
    or ``python -W ignore::patchkit.PatchkitWarning``.
    """


class PatchInstallError(PatchkitError):
    """Installing a patch failed; everything it had installed was rolled back.

    If an undo step itself raised during that rollback, ``rollback_errors`` names each (the rest was
    still rolled back) and what could not be undone stays with the patch, so ``revert()`` retries it.
    """

    def __init__(self, patch_id: str, target: str, cause: BaseException,
                 rollback_errors: Sequence[tuple[str, BaseException]] = ()) -> None:
        self.patch_id = patch_id
        self.target = target
        self.rollback_errors = tuple(rollback_errors)
        #: What the rollback could not undo (installer records); the engine keeps it for revert().
        self.leftovers: list[Any] = []
        if self.rollback_errors:
            undone = "; ".join(f"{where}: {error!r}" for where, error in self.rollback_errors)
            message = (f"{patch_id}: installing {target} failed: {cause!r}; the rollback could not undo "
                       f"{undone} (everything else was rolled back; patchkit.revert({patch_id!r}) retries)")
        else:
            message = f"{patch_id}: installing {target} failed and was rolled back: {cause!r}"
        super().__init__(message)
        self.__cause__ = cause


class UndoError(PatchkitError):
    """Restoring some targets of one patch raised; the others were restored.

    ``failures`` holds (target, error) for each step that raised; those steps stay recorded with the
    patch, so a later ``revert()`` tries them again.
    """

    def __init__(self, patch_id: str, failures: Sequence[tuple[str, BaseException]]) -> None:
        self.patch_id = patch_id
        self.failures = tuple(failures)
        listed = "; ".join(f"{where}: {error!r}" for where, error in self.failures)
        super().__init__(f"{patch_id}: restoring the originals failed at {listed}; the other targets were restored")


class RevertError(PatchkitError):
    """Reverting several patches: everything that could be reverted was, and these could not.

    ``errors`` maps each patch id to its error (``ForeignWrapperError``, ``UndoError``, ...).
    """

    def __init__(self, errors: Mapping[str, BaseException]) -> None:
        self.errors = dict(errors)
        listed = "; ".join(f"{error}" for error in self.errors.values())
        super().__init__(f"{len(self.errors)} patch(es) not fully reverted, every other one was: {listed}")
        self.__cause__ = next(iter(self.errors.values()), None)


class ForeignWrapperError(PatchkitError):
    """Reverting would strip a third party's wrapper installed on top of patchkit's; refused."""

    def __init__(self, patch_id: str, targets: Sequence[str]) -> None:
        self.patch_id = patch_id
        self.targets = tuple(targets)
        super().__init__(
            f"{patch_id}: not reverted, another object was installed on top of patchkit's at "
            f"{', '.join(self.targets)}; revert that wrapper first"
        )


class DriftError(PatchkitError):
    """Upstream's code at a target differs from every fingerprint recorded for the variant (strict mode).

    Raised before anything is installed, so nothing is half-applied.
    """

    def __init__(self, patch_id: str, variant: str, targets: Sequence[str], compared: Sequence[str]) -> None:
        self.patch_id = patch_id
        self.variant = variant
        self.targets = tuple(targets)
        self.compared = tuple(compared)
        super().__init__(
            f"{patch_id}: not applied, upstream code at {', '.join(self.targets)} differs from the fingerprint "
            f"recorded for variant {variant} on {'; '.join(self.compared)}; check the patch against the installed "
            f"upstream, then run its tests and `patchkit matrix record`, or set PATCHKIT_STRICT=0 to apply it "
            f"with a warning"
        )


class ForceRefusedError(PatchkitError):
    """``PATCHKIT_FORCE`` named a patch that upstream has natively on the installed version.

    Forcing would install the patch on top of upstream's own implementation: the behaviour twice
    (Megatron-Bridge 0.5+ renumbers local experts itself; forcing the old renumbering made rank 3
    of 4 export experts 12, 13 instead of 6, 7). Nothing is installed.
    """

    def __init__(self, patch_id: str, versions: dict[str, str | None], native_variant: str, why: str) -> None:
        self.patch_id = patch_id
        self.native_variant = native_variant
        shown = ", ".join(f"{d} {v}" for d, v in versions.items())
        super().__init__(
            f"{patch_id}: PATCHKIT_FORCE refused: upstream has this natively on {shown} (variant {native_variant}: "
            f"{why}); forcing would apply it twice. Remove {patch_id} from PATCHKIT_FORCE"
        )


class UnknownVariableError(ConfigError):
    """A ``PATCHKIT_*`` variable is set that patchkit does not read (a misspelled name)."""

    def __init__(self, variable: str, value: str, suggestions: Sequence[str]) -> None:
        self.suggestions = tuple(suggestions)
        hint = f"did you mean {', '.join(self.suggestions)}?" if self.suggestions else "see docs/configuration.md"
        super().__init__(variable, value, f"a documented PATCHKIT_* variable ({hint})",
                         problem="not a variable patchkit reads")
