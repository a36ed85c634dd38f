"""Installing and removing one variant's actions, all or nothing.

Attributes are read and written through the owner's ``__dict__`` semantics: the raw class attribute
(a ``staticmethod`` object, not the function it wraps) is what is saved and restored, and an
attribute that was inherited rather than owned is deleted on revert instead of being copied down.

Interruptions. An exception can arrive between any two lines (a ``KeyboardInterrupt``, a SIGTERM
handler that raises, a trace function): the records are therefore kept so that every point is
recoverable. A step is recorded *before* its attribute is set, restoring is idempotent (a target
that already holds its original is left alone), and a restored step is dropped from the record
only after it was restored; so whatever was interrupted, undoing the record again puts every
original back and never mistakes patchkit's own half-done work for a foreign wrapper.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable

from . import interrupts
from .declaration import Action, Add, Call, Reference, Replace, Target
from .errors import ForeignWrapperError, PatchInstallError, TargetResolutionError, UndoError
from .records import Record

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


def _redefines(current: Any, original: Any) -> bool:
    """``current`` is another function object made from the same ``def`` as ``original`` (same file,
    line and name): what re-running the original's module leaves at the target."""
    code, before = getattr(_unwrapped(current), "__code__", None), getattr(_unwrapped(original), "__code__", None)
    if code is None or before is None or current is original:
        return False
    return (code.co_filename, code.co_firstlineno, code.co_name) == (
        before.co_filename, before.co_firstlineno, before.co_name)


class Installed(Record):
    """One attribute patchkit set, with what it needs to put things back."""

    target: str
    owner: Any
    name: str
    previous: Any  #: the owner's own value before, or _ABSENT if it had none
    installed: Any
    where: Target | None = None  #: the declared target, to look it up again (see is_displaced)

    def _current(self) -> Any:
        return getattr(self.owner, "__dict__", {}).get(self.name, _ABSENT)

    def is_outermost(self) -> bool:
        return self._current() is self.installed

    def is_restored(self) -> bool:
        """The target holds its original again (or never received patchkit's object), or a new
        definition of it (its module was reloaded): either way, nothing of patchkit's is there."""
        current = self._current()
        return current is self.previous or (current is not self.installed and _redefines(current, self.previous))

    def apply(self) -> None:
        setattr(self.owner, self.name, self.installed)

    def is_displaced(self) -> bool:
        """The target no longer uses patchkit's object, though nothing reverted it: its module was
        reloaded or imported again (the target's path now leads to a new class or module), or the
        attribute holds a new definition of the original code (``importlib.reload`` re-runs a
        module's ``def``s). A third party's wrapper on top is not displacement (see ``revert``)."""
        if self.where is not None and sys.modules.get(self.where.module) is not None:
            try:
                if resolve_owner(self.where) is not self.owner:
                    return True
            except TargetResolutionError:
                return True
        return not self.is_outermost() and _redefines(self._current(), self.previous)

    def restore(self) -> None:
        """Put the original back; a no-op if it is already there (an interrupted undo is retried)."""
        if self.is_restored():
            return
        if self.previous is _ABSENT:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.previous)


class Registration(Record):
    """A ``Call`` action that ran; ``undo`` reverses it."""

    target: str
    undo: Callable[[], Any]

    def is_outermost(self) -> bool:
        return True

    def is_restored(self) -> bool:
        return False

    def restore(self) -> None:
        self.undo()


class Prepared(Record):
    """An action with its references resolved: everything an install needs, imported already."""

    action: Action
    #: Replace: the replacement; Wrap: the factory; Add: the value; Call: the install callable.
    obj: Any
    #: Call: the uninstall callable; otherwise None.
    undo: Any = None


def _where(action: Action) -> str:
    return action.after if isinstance(action, Call) else action.target


def prepare_all(patch_id: str, actions: tuple[Action, ...], package: str | None) -> list[Prepared]:
    """Resolve every reference of ``actions``, importing their implementation modules.

    The engine calls this *without* holding its lock: an import can wait for another thread's
    import, and that thread may be waiting for the engine (its post-import hook). Installing
    (:func:`install_all`) then only sets attributes. ``TargetResolutionError`` is raised as is;
    anything else becomes ``PatchInstallError`` naming the action.
    """
    prepared = []
    for action in actions:
        try:
            if isinstance(action, Call):
                prepared.append(Prepared(action, resolve_reference(action.install, package),
                                         resolve_reference(action.uninstall, package)))
            elif isinstance(action, Add):
                prepared.append(Prepared(action, resolve_reference(action.value, package)))
            elif isinstance(action, Replace):
                prepared.append(Prepared(action, resolve_reference(action.replacement, package)))
            else:
                prepared.append(Prepared(action, resolve_reference(action.factory, package)))
        except TargetResolutionError:
            raise
        except Exception as exc:  # an interruption (not an Exception) goes through as it is
            raise PatchInstallError(patch_id, _where(action), exc) from exc
    return prepared


def _install_one(item: Prepared, done: list[Installed | Registration]) -> None:
    """Install one action, recording it in ``done`` before its attribute is set (see the module doc)."""
    action = item.action
    if isinstance(action, Call):
        # The install callable is one step to patchkit: a signal is held until it is recorded.
        with interrupts.deferred():
            item.obj()
            done.append(Registration(f"{action.after}: {getattr(item.obj, '__qualname__', item.obj)}", item.undo))
        return
    (target,) = action.targets
    owner = resolve_owner(target)
    name = target.attribute
    current = raw_attribute(owner, name)
    if isinstance(action, Add):
        if current is not _ABSENT:
            raise TargetResolutionError(str(target), "already exists; Add only creates new attributes")
        new = item.obj
    else:
        if current is _ABSENT:
            raise TargetResolutionError(str(target), f"{name} does not exist on {owner!r}")
        if isinstance(action, Replace):
            new = _same_binding(current, item.obj)
        else:
            new = _same_binding(current, item.obj(_unwrapped(current)))
    previous = owner.__dict__[name] if _owns(owner, name) else _ABSENT
    installed = Installed(str(target), owner, name, previous, new, target)
    done.append(installed)
    installed.apply()


def install_all(patch_id: str, prepared: list[Prepared],
                done: list[Installed | Registration] | None = None) -> list[Installed | Registration]:
    """Install every prepared action or none: on failure, undo what was done, newest first, and raise.

    ``done`` (a new list if not given) is filled in place as each step installs, so a caller holding
    it always knows what is installed, even if an exception interrupts this function. Any exception,
    a ``KeyboardInterrupt`` included, rolls back what was done; an interruption (any exception that
    is not an ``Exception``: ``KeyboardInterrupt``, ``SystemExit``, a signal handler's own
    ``BaseException``) is then re-raised as it is. ``TargetResolutionError`` is re-raised as is (the
    caller reports it as a missing target) when the rollback was complete; anything else, or a
    rollback that could not undo every step, becomes ``PatchInstallError`` naming the target, with
    ``leftovers`` holding what is still installed (``done`` itself).
    """
    done = [] if done is None else done
    for item in prepared:
        try:
            _install_one(item, done)
        except BaseException as exc:
            with interrupts.deferred():
                failures = rollback(done)
            if not isinstance(exc, Exception):  # an interruption (Ctrl-C, sys.exit, a handler's BaseException)
                raise
            if isinstance(exc, TargetResolutionError) and not failures:
                raise
            error = PatchInstallError(patch_id, _where(item.action), exc, failures)
            error.leftovers = done
            raise error from exc
    return done


def rollback(done: list[Installed | Registration]) -> list[tuple[str, BaseException]]:
    """Undo ``done`` newest first, going on past a step that raises.

    Afterwards ``done`` holds only the steps whose undo raised (still installed), and the result
    names each with its error: nothing else is left behind, and nothing is lost. A step leaves
    ``done`` only once it is restored, so if this is itself interrupted, ``done`` still holds every
    step that may need undoing (restoring one twice is harmless).
    """
    failures: list[tuple[str, BaseException]] = []
    for index in range(len(done) - 1, -1, -1):
        item = done[index]
        try:
            item.restore()
        except Exception as exc:
            failures.append((item.target, exc))
            continue
        del done[index]
    return failures


def uninstall_all(patch_id: str, done: list[Installed | Registration]) -> None:
    """Restore the originals by identity, newest first, but only if patchkit's objects are outermost.

    A step whose target already holds its original (an earlier, interrupted call restored it) counts
    as restored. If a third party installed something on top of any of them, nothing is touched and
    ``ForeignWrapperError`` names the targets: stripping their wrapper silently would break them.
    If an undo step raises, the others still run; ``done`` keeps the steps that failed (so a later
    call retries exactly those) and ``UndoError`` names each.
    """
    foreign = [item.target for item in done if not item.is_outermost() and not item.is_restored()]
    if foreign:
        raise ForeignWrapperError(patch_id, foreign)
    failures = rollback(done)
    if failures:
        raise UndoError(patch_id, failures)
