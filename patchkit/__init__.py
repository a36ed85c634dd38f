"""patchkit: versioned, reversible patches for Megatron-Core, Megatron-Bridge, ModelOpt and vLLM.

Call :func:`apply_all` once at process start. ``import patchkit`` imports no upstream, no torch, and
not the patch catalogue: the catalogue is loaded by the first call that needs it. The first
``apply_all()`` of a process settles what it can from the catalogue's index alone and builds the
engine only once something needs it (see :mod:`patchkit.runtime.process_engine`).
"""

from __future__ import annotations

import os

from ._version import __version__ as __version__
from .runtime import logs, process_engine
from .runtime.errors import (
    ConfigError,
    DeclarationError,
    DriftError,
    ForceRefusedError,
    ForeignWrapperError,
    PatchInstallError,
    PatchkitError,
    PatchkitWarning,
    RevertError,
    TargetResolutionError,
    UndoError,
    UnknownPatchError,
    UnsupportedVersionError,
)
from .runtime.settings import EXTRA_PATCHES
from .runtime.status import PatchStatus, Reason, State

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    import contextlib
    from typing import Any, Mapping, Sequence

    from .runtime import probing
    from .runtime.catalogue import Registered
    from .runtime.declaration import Add, Call, Patch, Replace, Target, Variant, Wrap
    from .runtime.engine import Engine

#: Names served from their module on first use (PEP 562): a declaration module imports them, start-up
#: does not (the catalogue's index is read as plain data, and the engine is built when first needed).
_DECLARATION_NAMES = frozenset({"Add", "Call", "Patch", "Replace", "Target", "Variant", "Wrap"})


def __getattr__(name: str) -> Any:
    if name in _DECLARATION_NAMES:
        from .runtime import declaration

        return getattr(declaration, name)
    if name == "Engine":
        from .runtime.engine import Engine as engine_class

        return engine_class
    if name == "Registered":
        from .runtime.catalogue import Registered as record_class

        return record_class
    if name == "probing":  # helpers for implementation modules, not for start-up
        from .runtime import probing as module

        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, those served on first use included (completion and ``dir()`` list them)."""
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Add", "Call", "ConfigError", "DeclarationError", "DriftError", "Engine", "ForceRefusedError",
    "ForeignWrapperError", "Patch", "PatchInstallError", "PatchStatus", "PatchkitError", "PatchkitWarning", "Reason",
    "Registered", "Replace", "RevertError", "State", "Target", "TargetResolutionError", "UndoError",
    "UnknownPatchError", "UnsupportedVersionError", "Variant", "Wrap",
    "apply", "apply_all", "applied", "engine", "probing", "register_extra_patches", "revert", "revert_all", "status",
    "why_not_installed",
]

# The NullHandler a library owes its users, added once `logging` is imported (patchkit does not import it).
logs.arm()

#: The process-wide engine, loading the shipped catalogue on first use.
engine = process_engine.engine


def apply_all(
    *,
    enable: Sequence[str] | str | None = None,
    disable: Sequence[str] | str | None = None,
    force: Sequence[str] | str | None = None,
    opt_in: Sequence[str] | str | None = None,
    strict: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[PatchStatus]:
    """Install every patch that applies to the installed upstreams; call once at process start.

    Patches whose upstream modules are already imported are installed now; the others when those
    modules are first imported. Idempotent. Arguments override the ``PATCHKIT_*`` variables
    (``opt_in``: ``PATCHKIT_OPT_IN``, opt-in patches to apply too); a patch disabled after it was
    applied is reverted.
    Declaration modules named in ``PATCHKIT_EXTRA_PATCHES`` are registered first.
    """
    register_extra_patches(environ)
    if all(given is None for given in (enable, disable, force, opt_in, strict)):
        settled = process_engine.apply_all_from_index(environ)
        if settled is not None:
            return settled
    return engine().apply_all(enable=enable, disable=disable, force=force, opt_in=opt_in, strict=strict,
                              environ=environ)


def register_extra_patches(environ: Mapping[str, str] | None = None) -> None:
    """Register the declaration modules named in ``PATCHKIT_EXTRA_PATCHES`` (what ``apply_all`` and
    the CLI do first). A module that cannot be registered is logged and warned about
    (``PatchkitWarning``): its patches are missing. A malformed value is left to ``apply_all``, which
    reports it with every other malformed variable (``config_error``, or ``ConfigError`` if strict)."""
    if not (os.environ if environ is None else environ).get(EXTRA_PATCHES):
        return
    try:
        problems = process_engine.register_extra_patches(environ)[1]
    except ConfigError:
        return
    from .runtime.engine import first_time, warn  # only with something to say

    for problem in problems:
        if first_time(f"patchkit: {problem}"):  # once per process, however often the module is retried
            logs.get("patchkit").error("patchkit: %s", problem)
            warn(f"patchkit: {problem}")


def apply(*patterns: str, import_targets: bool = False, strict: bool | None = None) -> list[PatchStatus]:
    """Apply the patches matching ids or globs, opt-in ones included."""
    return engine().apply(*patterns, import_targets=import_targets, strict=strict)


def applied(*patterns: str, strict: bool | None = None) -> contextlib.AbstractContextManager[list[PatchStatus]]:
    """``with patchkit.applied("megatron.*"):`` apply now, revert on exit. For tests."""
    return engine().applied(*patterns, strict=strict)


def revert(patch_id: str) -> PatchStatus:
    """Restore one patch's originals."""
    return engine().revert(patch_id)


def revert_all() -> list[PatchStatus]:
    """Restore every patch's originals that can be restored."""
    return engine().revert_all()


def status(*patterns: str) -> list[PatchStatus]:
    """Every patch's state, reason, variant and upstream versions in this process."""
    return engine().status(*patterns)


def why_not_installed(*patch_ids: str) -> str | None:
    """``None`` if one of ``patch_ids`` is installed in this process, else why the first one is not.

    The one way a helper API asks whether the patch it needs is in place; it raises its own typed
    error with the answer (``"patch 'vllm.lora_from_tensors' is skipped, opt_in"``, the engine's
    detail in parentheses when it has one, or ``"patch 'x.y' is not registered"``).
    """
    if not patch_ids:
        raise ValueError("why_not_installed() needs at least one patch id")
    records = {record.id: record for record in engine().status(*patch_ids)}
    if any(records[patch_id].state.installed for patch_id in patch_ids if patch_id in records):
        return None
    record = records.get(patch_ids[0])
    if record is None:
        return f"patch {patch_ids[0]!r} is not registered"
    why = record.state.value + (f", {record.reason.value}" if record.reason else "")
    return f"patch {record.id!r} is {why}" + (f" ({record.detail})" if record.detail else "")
