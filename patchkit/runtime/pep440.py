"""PEP 440 versions and specifiers: the part of ``packaging`` the runtime needs, without its import.

``from packaging.specifiers import SpecifierSet`` imports ``packaging.utils``, which imports
``packaging.tags`` and with it ``subprocess``, ``sysconfig`` and the manylinux probes: most of a
15 ms start-up budget, spent to compare three version numbers. So the runtime parses and compares
versions here, with ``packaging``'s rules, and the tooling (``patchkit.matrix``) keeps using
``packaging`` itself. ``tests/engine/test_pep440.py`` checks this module against ``packaging`` on
a grid of versions and specifiers (pre, post, dev, local, epochs, wildcards, ``~=``).

Specifiers are always evaluated as ``packaging``'s ``contains(version, prereleases=True)``: a
pre-release is never excluded *because* it is a pre-release. PEP 440's exclusive-bound rules still
hold, and they decide how ranges treat the next version's pre-releases (docs/compat-matrix.md, "Version
ranges and pre-releases"): ``<0.48`` excludes ``0.48.0rc1`` (a pre-release of the bound itself is
not "below" it) and ``>=0.48`` excludes it too (it sorts before ``0.48``). A variant meant to cover
the pre-releases of its first version writes its bounds as ``>=0.48.0rc0,<0.49.0rc0``.
"""

from __future__ import annotations

from .errors import PatchkitError
from .records import Record

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    import re
    from typing import Any


class InvalidVersion(PatchkitError, ValueError):
    """A string that is not a PEP 440 version."""


class InvalidSpecifier(PatchkitError, ValueError):
    """A string that is not a PEP 440 specifier set."""


# packaging's VERSION_PATTERN (PEP 440 appendix B), which accepts the non-canonical spellings too.
# Compiled on first use (about 1 ms): the versions a process meets at start-up are nearly all of the
# plain form _plain reads alone, without `re`.
_VERSION_PATTERN = r"""
    v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
"""
_version: "re.Pattern[str] | None" = None
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "pre": 2, "preview": 2, "rc": 2}
#: One clause of a specifier set; compiled by `re` when first used (a decision, not start-up).
_SPEC = r"^\s*(~=|==|!=|<=|>=|<|>)\s*([^\s=<>!~]\S*)\s*$"
_DIGITS = frozenset("0123456789")


class Version(Record):
    """A parsed version, ordered as PEP 440 (and ``packaging``) order it."""

    epoch: int
    release: tuple[int, ...]
    pre: tuple[int, int] | None  #: (0 a | 1 b | 2 rc, number)
    post: int | None
    dev: int | None
    local: tuple[int | str, ...] | None
    text: str

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    @property
    def is_postrelease(self) -> bool:
        return self.post is not None

    @property
    def base(self) -> "Version":
        """Epoch and release only (``packaging``'s ``base_version``)."""
        return Version(self.epoch, self.release, None, None, None, None, self.text)

    @property
    def public(self) -> "Version":
        return self._replace(local=None)

    def key(self) -> tuple[Any, ...]:
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        if self.pre is None and self.post is None and self.dev is not None:
            pre: tuple[int, ...] = (-1,)  # 1.0.dev0 sorts before 1.0a0
        else:
            pre = (1,) if self.pre is None else (0, *self.pre)
        post = (-1,) if self.post is None else (0, self.post)
        dev = (1,) if self.dev is None else (0, self.dev)
        local: tuple[Any, ...] = (0,) if self.local is None else (1, tuple(
            (1, part, "") if isinstance(part, int) else (0, 0, part) for part in self.local))
        return self.epoch, tuple(release), pre, post, dev, local

    def __str__(self) -> str:
        return self.text


def parse(text: str) -> Version:
    """Parse ``text`` as a PEP 440 version; raise :class:`InvalidVersion` otherwise."""
    global _version
    plain = _plain(text.strip())
    if plain is not None:
        return plain
    import re  # for the versions _plain does not read: not at start-up

    if _version is None:
        _version = re.compile(_VERSION_PATTERN, re.VERBOSE | re.IGNORECASE)
    match = _version.fullmatch(text.strip())
    if match is None:
        raise InvalidVersion(f"{text!r} is not a PEP 440 version")
    pre = None
    if match["pre_l"]:
        pre = (_PRE[match["pre_l"].lower()], int(match["pre_n"] or 0))
    post = None
    if match["post"]:
        post = int(match["post_n1"] or match["post_n2"] or 0)
    local = None
    if match["local"]:
        local = tuple(int(p) if p.isdigit() else p.lower() for p in re.split(r"[-_.]", match["local"]))
    return Version(int(match["epoch"] or 0), tuple(int(p) for p in match["release"].split(".")), pre, post,
                   int(match["dev_n"] or 0) if match["dev"] else None, local, text.strip())


def _plain(text: str) -> Version | None:
    """Release segments with at most a pre-release spelled the canonical way (``0.19.2``,
    ``0.14.0rc0``), read with string methods: the full pattern's answer, without importing `re`."""
    release, pre = text, None
    for label in ("rc", "a", "b"):
        head, found, number = text.rpartition(label)
        if found:
            if not number or not _DIGITS.issuperset(number):
                return None
            release, pre = head, (_PRE[label], int(number))
            break
    parts = release.split(".")
    if not all(part and _DIGITS.issuperset(part) for part in parts):
        return None
    return Version(0, tuple(int(part) for part in parts), pre, None, None, None, text)


def _eq(version: Version, spec: str) -> bool:
    if spec.endswith(".*"):
        prefix = parse(spec[:-2])
        if version.epoch != prefix.epoch:
            return False
        release = version.release + (0,) * max(0, len(prefix.release) - len(version.release))
        if release[:len(prefix.release)] != prefix.release:
            return False
        # ==1.2rc1.* style prefixes also pin what follows the release
        return all(getattr(prefix, part) is None or getattr(prefix, part) == getattr(version, part)
                   for part in ("pre", "post", "dev"))
    wanted = parse(spec)
    candidate = version if wanted.local is not None else version.public
    return candidate.key() == wanted.key()


def _matches(version: Version, operator: str, spec: str) -> bool:
    if operator == "==":
        return _eq(version, spec)
    if operator == "!=":
        return not _eq(version, spec)
    if operator == "~=":
        bound = parse(spec)
        prefix = ".".join(str(p) for p in bound.release[:-1])
        epoch = f"{bound.epoch}!" if bound.epoch else ""
        return _matches(version, ">=", spec) and _eq(version, f"{epoch}{prefix}.*")
    bound = parse(spec)
    if operator == "<=":
        return version.public.key() <= bound.key()
    if operator == ">=":
        return version.public.key() >= bound.key()
    if operator == "<":
        # PEP 440: <V excludes V's own pre-releases unless V is one (0.48.0rc1 is not <0.48)
        own_pre = (version.is_prerelease and not bound.is_prerelease
                   and version._replace(pre=None, dev=None, local=None).key() == bound.key())
        return version.key() < bound.key() and not own_pre
    if operator == ">":
        # PEP 440: >V excludes V's post-releases (unless V is one) and V's local versions
        own_post = (version.is_postrelease and not bound.is_postrelease
                    and version._replace(post=None, dev=None, local=None).key() == bound.key())
        own_local = version.local is not None and version.public.key() == bound.key()
        return version.key() > bound.key() and not own_post and not own_local
    raise InvalidSpecifier(f"unknown operator {operator!r}")  # pragma: no cover: the regex allows no other


class SpecifierSet:
    """A comma-separated PEP 440 specifier set, e.g. ``>=0.14,<0.20``. ``===`` (arbitrary equality)
    is not accepted: no declaration needs it."""

    __slots__ = ("text", "clauses")

    def __init__(self, text: str) -> None:
        self.text = text
        self.clauses: list[tuple[str, str]] = []
        for part in text.split(","):
            if not part.strip():
                if text.strip():
                    raise InvalidSpecifier(f"{text!r}: empty clause")
                continue
            import re  # compiled once and cached by `re`

            match = re.match(_SPEC, part)
            if match is None:
                raise InvalidSpecifier(f"{part.strip()!r} is not a PEP 440 specifier")
            operator, version = match.groups()
            wildcard = version.endswith(".*")
            if wildcard and operator not in ("==", "!="):
                raise InvalidSpecifier(f"{part.strip()!r}: '.*' is only allowed with == and !=")
            parsed = parse(version[:-2] if wildcard else version)  # raises on a malformed version
            if parsed.local is not None and operator not in ("==", "!="):
                raise InvalidSpecifier(f"{part.strip()!r}: a local version is only allowed with == and !=")
            if operator == "~=" and len(parsed.release) < 2:
                raise InvalidSpecifier(f"{part.strip()!r}: ~= needs at least two release segments")
            self.clauses.append((operator, version))

    def contains(self, version: Version | str) -> bool:
        """Whether ``version`` satisfies every clause (pre-releases allowed, see the module doc)."""
        if isinstance(version, str):
            version = parse(version)
        return all(_matches(version, operator, spec) for operator, spec in self.clauses)

    def above(self, version: Version | str) -> bool:
        """Whether ``version`` lies past this range's upper end: it meets every lower bound (``>=``,
        ``>``) and misses an upper one (``<``, ``<=``, or a ``==``/``~=`` it is greater than).
        A version the range holds, one below it, or one only a ``!=`` excludes is not above it."""
        if isinstance(version, str):
            version = parse(version)
        if not all(_matches(version, op, spec) for op, spec in self.clauses if op in (">=", ">")):
            return False
        for op, spec in self.clauses:
            if op in ("<", "<=") and not _matches(version, op, spec):
                return True
            if op in ("==", "~=") and not _matches(version, op, spec):
                bound = parse(spec[:-2] if spec.endswith(".*") else spec)
                if version.public.key() > bound.key():
                    return True
        return False

    def bounds(self) -> list[tuple[str, Version]]:
        """(operator, version) of every clause except wildcards."""
        return [(op, parse(v)) for op, v in self.clauses if not v.endswith(".*")]

    def __repr__(self) -> str:
        return f"SpecifierSet({self.text!r})"
