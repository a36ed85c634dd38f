"""Installing and removing one variant's actions, all or nothing.

Attributes are read and written through the owner's ``__dict__`` semantics: the raw class attribute
(a ``staticmethod`` object, not the function it wraps) is what is saved and restored, and an
attribute that was inherited rather than owned is deleted on revert instead of being copied down.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable, NamedTuple

from .declaration import Action, Add, Call, Reference, Replace, Target, Wrap
from .errors import ForeignWrapperError, PatchInstallError, TargetResolutionError

_ABSENT = object()


def resolve_reference(reference: Reference, package: str | None) -> Any:
    """The object a ``"module:qualname"`` reference names; a non-string reference is itself."""
    if not isinstance(reference, str):
        return reference
    module_name, sep, qualname = reference.partition(":")
    if not sep:
        raise TargetResolutionError(reference, "a reference must look like 'module:qualname'")
    if module_name.startswith("."):
        if package is None:
            raise TargetResolutionError(reference, "a relative reference needs a declaring package")
        module_name = importlib.util.resolve_name(module_name, package)
    obj: Any = importlib.import_module(module_name)
    for name in qualname.split("."):
        obj = getattr(obj, name)
    return obj


def resolve_owner(target: Target) -> Any:
    """The object that holds the target attribute. The module must already be imported."""
    owner: Any = sys.modules.get(target.module)
    if owner is None:
        raise TargetResolutionError(str(target), f"module {target.module} is not imported")
    walked = target.module
    for name in target.path[:-1]:
        walked = f"{walked}.{name}"
        owner = getattr(owner, name, _ABSENT)
        if owner is _ABSENT:
            raise TargetResolutionError(str(target), f"{walked} does not exist")
    return owner


def raw_attribute(owner: Any, name: str) -> Any:
    """The attribute as stored (descriptors unbound), looked up along the MRO for classes."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in klass.__dict__:
                return klass.__dict__[name]
        return _ABSENT
    return getattr(owner, "__dict__", {}).get(name, _ABSENT)


def _owns(owner: Any, name: str) -> bool:
    return name in getattr(owner, "__dict__", {})


def _same_binding(original: Any, replacement: Any) -> Any:
    """Keep a static/class method static/class when a plain function replaces it."""
    for kind in (staticmethod, classmethod):
        if isinstance(original, kind) and not isinstance(replacement, kind):
            return kind(replacement)
    return replacement


def _unwrapped(raw: Any) -> Any:
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


class Installed(NamedTuple):
    """One attribute patchkit set, with what it needs to put things back."""

    target: str
    owner: Any
    name: str
    previous: Any  #: the owner's own value before, or _ABSENT if it had none
    installed: Any

    def is_outermost(self) -> bool:
        return getattr(self.owner, "__dict__", {}).get(self.name, _ABSENT) is self.installed

    def restore(self) -> None:
        if self.previous is _ABSENT:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.previous)


class Registration(NamedTuple):
    """A ``Call`` action that ran; ``undo`` reverses it."""

    target: str
    undo: Callable[[], Any]

    def is_outermost(self) -> bool:
        return True

    def restore(self) -> None:
        self.undo()


def _install_one(action: Action, package: str | None) -> list[Installed | Registration]:
    if isinstance(action, Call):
        install = resolve_reference(action.install, package)
        uninstall = resolve_reference(action.uninstall, package)
        install()
        return [Registration(f"{action.after}: {getattr(install, '__qualname__', install)}", uninstall)]
    (target,) = action.targets
    owner = resolve_owner(target)
    name = target.attribute
    current = raw_attribute(owner, name)
    if isinstance(action, Add):
        if current is not _ABSENT:
            raise TargetResolutionError(str(target), "already exists; Add only creates new attributes")
        new = resolve_reference(action.value, package)
    else:
        if current is _ABSENT:
            raise TargetResolutionError(str(target), f"{name} does not exist on {owner!r}")
        if isinstance(action, Replace):
            new = _same_binding(current, resolve_reference(action.replacement, package))
        else:
            assert isinstance(action, Wrap)
            factory = resolve_reference(action.factory, package)
            new = _same_binding(current, factory(_unwrapped(current)))
    previous = owner.__dict__[name] if _owns(owner, name) else _ABSENT
    setattr(owner, name, new)
    return [Installed(str(target), owner, name, previous, new)]


def install_all(patch_id: str, actions: tuple[Action, ...], package: str | None) -> list[Installed | Registration]:
    """Install every action or none: on failure, undo what was done, newest first, and raise.

    ``TargetResolutionError`` is re-raised as is (the caller reports it as a missing target);
    anything else becomes ``PatchInstallError`` naming the target.
    """
    done: list[Installed | Registration] = []
    for action in actions:
        try:
            done.extend(_install_one(action, package))
        except BaseException as exc:
            rollback(done)
            if isinstance(exc, (TargetResolutionError, KeyboardInterrupt, SystemExit)):
                raise
            where = action.after if isinstance(action, Call) else action.target
            raise PatchInstallError(patch_id, where, exc) from exc
    return done


def rollback(done: list[Installed | Registration]) -> None:
    for item in reversed(done):
        item.restore()
    done.clear()


def uninstall_all(patch_id: str, done: list[Installed | Registration]) -> None:
    """Restore the originals by identity, newest first, but only if patchkit's objects are outermost.

    If a third party installed something on top of any of them, nothing is touched and
    ``ForeignWrapperError`` names the targets: stripping their wrapper silently would break them.
    """
    foreign = [item.target for item in done if not item.is_outermost()]
    if foreign:
        raise ForeignWrapperError(patch_id, foreign)
    rollback(done)
