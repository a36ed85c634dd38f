"""What a patch declares, as plain data: its identity, its variants and the actions each installs.

Declarations are imported by ``apply_all()`` at process start, so this module and every declaration
module in the catalogue stay free of heavy imports: references to replacement code are strings
resolved only when a variant is installed. The records are named tuples (:class:`~.records.Record`)
rather than dataclasses because ``dataclasses`` imports ``inspect`` (and ``ast``, ``dis``,
``tokenize``): most of the start-up budget. They are validated when registered (:func:`validate`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Union

from .errors import DeclarationError
from .records import Record

#: A replacement given as ``"package.module:Qualname"`` (``".module:name"`` is relative to the
#: declaring package) or as the object itself.
Reference = Union[str, Any]



def is_dotted_name(name: str) -> bool:
    """``package.module`` or ``Class.attr``: dot-separated ASCII identifiers. String methods rather
    than a regular expression, whose compiling would cost the first install a millisecond."""
    return name.isascii() and all(part.isidentifier() for part in name.split("."))


def is_patch_id(name: str) -> bool:
    """``upstream.name``: two or more dot-separated parts of lowercase letters, digits and ``_``, each
    starting with a letter."""
    parts = name.split(".")
    return len(parts) > 1 and all(part[:1].isalpha() and part.islower() and part.isidentifier() and part.isascii()
                                  for part in parts)


class Target(Record):
    """An attribute of an upstream object: ``module`` imported, then ``path`` walked with getattr."""

    module: str
    path: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str) -> "Target":
        found = _PARSED.get(spec)
        if found is None:
            module, sep, qualname = spec.partition(":")
            if not sep or not is_dotted_name(module) or not is_dotted_name(qualname):
                raise DeclarationError(f"target {spec!r} is not of the form 'package.module:Qualname.attr'")
            found = _PARSED[spec] = cls(module, tuple(qualname.split(".")))
        return found

    @property
    def attribute(self) -> str:
        return self.path[-1]

    def __str__(self) -> str:
        return f"{self.module}:{'.'.join(self.path)}"


#: Targets parsed so far: a decision and a status read each action's target again (kept small by
#: the catalogue's size: one entry per target string).
_PARSED: dict[str, Target] = {}


class Replace(Record):
    """Set the target attribute to the object ``replacement`` names. No per-call cost."""

    target: str
    replacement: Reference

    @property
    def targets(self) -> tuple[Target, ...]:
        return (Target.parse(self.target),)


class Wrap(Record):
    """Set the target attribute to ``factory(original)``: for patches that delegate to upstream."""

    target: str
    factory: Reference

    @property
    def targets(self) -> tuple[Target, ...]:
        return (Target.parse(self.target),)


class Add(Record):
    """Create an attribute upstream lacks. Fails if it exists; revert deletes it."""

    target: str
    value: Reference

    @property
    def targets(self) -> tuple[Target, ...]:
        return (Target.parse(self.target),)


class Call(Record):
    """A patch that is a registration through an upstream API rather than an attribute.

    ``install()`` is called once ``after`` (a module name) is imported; ``uninstall()`` undoes it.
    """

    install: Reference
    uninstall: Reference
    after: str

    @property
    def targets(self) -> tuple[Target, ...]:
        return ()


Action = Union[Replace, Wrap, Add, Call]


def action_modules(action: Action) -> tuple[str, ...]:
    """The modules that must be imported before ``action`` can be installed."""
    if isinstance(action, Call):
        return (action.after,)
    return tuple(target.module for target in action.targets)


class Variant(Record):
    """One implementation of a patch, valid where every ``requires`` specifier holds.

    ``requires`` maps distribution names to PEP 440 specifier sets. ``native`` says upstream has the
    behaviour in this range: the patch is then reported ``native`` and nothing is installed.
    """

    requires: Mapping[str, str]
    installs: tuple[Action, ...] = ()
    native: str | None = None
    label: str | None = None

    @property
    def name(self) -> str:
        """A stable, human-readable name: the label, or the requirement itself."""
        if self.label:
            return self.label
        return ";".join(f"{dist}{spec}" for dist, spec in self.requires.items())

    @property
    def modules(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for action in self.installs:
            for module in action_modules(action):
                seen.setdefault(module, None)
        return tuple(seen)


class Patch(Record):
    """A named behaviour change for one or more upstreams, with its variants and its reasons.

    ``summary``/``why``/``upstream``/``removal`` are shown by ``patchkit list`` and ``explain``:
    what it does, why it exists, the upstream code or discussion it relates to, and when to delete it.
    ``version_modules`` maps a distribution to its import package: used to see cheaply whether it
    is installed at all, and to read ``__version__`` when it was installed without metadata.
    ``self_check`` names a behavioural test of the patch against the installed upstream
    (``".module:function"``, see :mod:`patchkit.selfcheck`), run by ``patchkit doctor`` and shared with
    the test suite; it is resolved only by the doctor, never at start-up.
    """

    id: str
    summary: str
    why: str
    upstream: str
    removal: str
    variants: tuple[Variant, ...]
    opt_in: bool = False
    version_modules: Mapping[str, str] = MappingProxyType({})
    self_check: Reference | None = None

    @property
    def distributions(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for variant in self.variants:
            for dist in variant.requires:
                seen.setdefault(dist, None)
        return tuple(seen)

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise KeyError(f"{self.id} has no variant {name!r}")


def validate(patch: Patch) -> None:
    """Raise ``DeclarationError`` if ``patch`` is malformed; called when it is registered."""
    if not is_patch_id(patch.id):
        raise DeclarationError(f"patch id {patch.id!r} must look like 'upstream.name' (lowercase, dots)")
    if not patch.variants:
        raise DeclarationError(f"{patch.id}: declares no variant")
    if patch.self_check is not None and not (callable(patch.self_check) or isinstance(patch.self_check, str)):
        raise DeclarationError(f"{patch.id}: self_check must be a 'module:function' reference or a callable, "
                               f"got {patch.self_check!r}")
    names = [variant.name for variant in patch.variants]
    if len(set(names)) != len(names):
        raise DeclarationError(f"{patch.id}: two variants share a name: {names}")
    for variant in patch.variants:
        if not isinstance(variant, Variant):
            raise DeclarationError(f"{patch.id}: variants must be Variant objects, got {variant!r}")
        if not variant.requires:
            raise DeclarationError(f"{patch.id}: variant {variant.name} requires no distribution")
        if variant.native is None and not variant.installs:
            raise DeclarationError(f"{patch.id}: variant {variant.name} installs nothing and is not native")
        if variant.native is not None and variant.installs:
            raise DeclarationError(f"{patch.id}: variant {variant.name} is native and cannot install actions")
        for action in variant.installs:
            if not isinstance(action, (Replace, Wrap, Add, Call)):
                raise DeclarationError(f"{patch.id}: {action!r} is not an action (Replace, Wrap, Add, Call)")
            _ = action.targets  # parsing raises on a malformed target path
