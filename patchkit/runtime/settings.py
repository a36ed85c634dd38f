"""The ``PATCHKIT_*`` environment variables, parsed and validated in one place.

Precedence is explicit argument > environment > default. Values are read once per ``apply_all()``
call, never on a hot path.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from typing import Iterable, Mapping, NamedTuple, Sequence

from .errors import ConfigError, UnknownPatchError

DISABLE = "PATCHKIT_DISABLE"
ENABLE = "PATCHKIT_ENABLE"
STRICT = "PATCHKIT_STRICT"
FORCE = "PATCHKIT_FORCE"
LOG_LEVEL = "PATCHKIT_LOG_LEVEL"
AUTOLOAD = "PATCHKIT_AUTOLOAD"
EXTRA_PATCHES = "PATCHKIT_EXTRA_PATCHES"
MANIFEST_DIR = "PATCHKIT_MANIFEST_DIR"
FINGERPRINT_CACHE = "PATCHKIT_FINGERPRINT_CACHE"

#: Documented in the README; every variable patchkit reads.
VARIABLES: Mapping[str, str] = {
    DISABLE: "comma-separated patch ids or globs not to apply ('*' = all)",
    ENABLE: "comma-separated ids or globs: apply only these, opt-in patches included",
    STRICT: "1/true/yes/on or 0/false/no/off: raise typed errors instead of recording failures",
    FORCE: "comma-separated ids or globs: apply the nearest variant outside the verified range",
    LOG_LEVEL: "DEBUG, INFO, WARNING, ERROR, CRITICAL or 0-50, for the 'patchkit' logger",
    AUTOLOAD: "1/true/yes/on or 0/false/no/off: apply patches at every interpreter start (the .pth hook)",
    EXTRA_PATCHES: "comma-separated importable modules exposing PATCHES, registered by autoload "
                   "in addition to the catalogue",
    MANIFEST_DIR: "a folder: every autoloaded process writes its manifest there (<host>-<pid>.json), "
                  "at start-up and at exit",
    FINGERPRINT_CACHE: "1/true/yes/on (the default) or 0/false/no/off: keep upstream fingerprints in "
                       "~/.cache/patchkit (a malformed value turns the cache off)",
}

MTP_OUTPUT_HEAD = "PATCHKIT_MTP_OUTPUT_HEAD"
MTP_WITHOUT_LABELS = "PATCHKIT_MTP_WITHOUT_LABELS"

#: Variables a catalogue patch reads (on first use, not at ``apply_all()``), each naming one of a few
#: choices; parsed here by :func:`choice` like every other ``PATCHKIT_*`` variable. The first choice is
#: the default. What each choice does is the patch's to document (patches/megatron/mtp/_options.py).
CHOICES: Mapping[str, tuple[str, ...]] = {
    MTP_OUTPUT_HEAD: ("detached", "trained"),
    MTP_WITHOUT_LABELS: ("skip", "derive"),
}

_PATTERN_FORM = "comma-separated patch ids or globs, e.g. 'megatron.mtp_postprocess,vllm.*' or '*'"
_PATTERN = re.compile(r"^[a-z0-9_.*?]+$|^[a-z0-9_.*?]*\[[a-z0-9_.!-]+\][a-z0-9_.*?]*$", re.ASCII)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_BOOL_FORM = "1, true, yes, on, 0, false, no, off"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Settings(NamedTuple):
    """Every ``PATCHKIT_*`` toggle, parsed: what one ``apply_all()`` call (or autoload) uses."""

    enable: tuple[str, ...] | None = None  #: None: no restriction
    disable: tuple[str, ...] = ()
    force: tuple[str, ...] = ()
    strict: bool = False
    log_level: int | None = None
    autoload: bool = False
    extra_patches: tuple[str, ...] = ()
    manifest_dir: str | None = None

    def is_enabled(self, patch_id: str, opt_in: bool) -> bool:
        if self.enable is None:
            return not opt_in
        return matches_any(patch_id, self.enable)

    def is_disabled(self, patch_id: str) -> bool:
        return matches_any(patch_id, self.disable)

    def is_forced(self, patch_id: str) -> bool:
        return matches_any(patch_id, self.force)


def matches_any(patch_id: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(patch_id, pattern) for pattern in patterns)


def is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _present(variable: str, value: str | None, accepted: str) -> str | None:
    """The value to parse, or None for unset/empty (the default). Whitespace alone is no value a
    person means to give: it is a malformed value, not "unset"."""
    if value is None or value == "":
        return None
    if not value.strip():
        raise ConfigError(variable, value, accepted, problem="malformed (whitespace only)")
    return value


def parse_patterns(variable: str, value: str | Sequence[str]) -> tuple[str, ...]:
    """Split a comma-separated list of ids/globs (or take a sequence); reject what cannot be one."""
    tokens = [token.strip() for token in (value.split(",") if isinstance(value, str) else value)]
    shown = value if isinstance(value, str) else ",".join(value)
    for token in tokens:
        if not token:
            raise ConfigError(variable, shown, _PATTERN_FORM, problem="malformed (empty entry)")
        if not _PATTERN.fullmatch(token) or ".." in token or token.startswith("."):
            raise ConfigError(variable, shown, _PATTERN_FORM, problem=f"malformed (bad entry {token!r})")
    return tuple(tokens)


def parse_bool(variable: str, value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case, surrounding spaces allowed); "" is false."""
    present = _present(variable, value, _BOOL_FORM)
    if present is None:
        return False
    lowered = present.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(variable, value, _BOOL_FORM)


_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", re.ASCII)
_MODULE_FORM = "comma-separated dotted module names, e.g. 'mypkg.patches,other.decl'"


def parse_modules(variable: str, value: str) -> tuple[str, ...]:
    """Split a comma-separated list of dotted module names; reject what cannot be one."""
    present = _present(variable, value, _MODULE_FORM)
    if present is None:
        return ()
    tokens = tuple(token.strip() for token in present.split(","))
    for token in tokens:
        if not token:
            raise ConfigError(variable, value, _MODULE_FORM, problem="malformed (empty entry)")
        if not _MODULE.fullmatch(token):
            raise ConfigError(variable, value, _MODULE_FORM, problem=f"malformed (bad entry {token!r})")
    return tokens


_LEVEL_FORM = f"{', '.join(_LEVELS)} or an integer 0-50"
#: ASCII digits only: str.isdigit() and int() also take '²', '１０' and '٣'.
_LEVEL_NUMBER = re.compile(r"^[0-9]{1,2}$", re.ASCII)


def parse_log_level(variable: str, value: str) -> int:
    present = _present(variable, value, _LEVEL_FORM)
    text = (present or "").strip().upper()
    if text in _LEVELS:
        return int(getattr(logging, text))
    if _LEVEL_NUMBER.fullmatch(text) and int(text) <= 50:
        return int(text)
    raise ConfigError(variable, value, _LEVEL_FORM)


_FOLDER_FORM = "a folder path, without surrounding whitespace"


def parse_folder(variable: str, value: str) -> str | None:
    """A folder path as given; None if unset. Surrounding whitespace is refused, not stripped: a
    folder named ' logs' is never what was meant."""
    present = _present(variable, value, _FOLDER_FORM)
    if present is not None and (present != present.strip() or "\0" in present):
        raise ConfigError(variable, value, _FOLDER_FORM)
    return present


def parse_choice(variable: str, value: str) -> str:
    """One of ``CHOICES[variable]``, in any case, surrounding spaces allowed; unset, empty or spaces
    alone: the default (the first choice). Raises ``ConfigError`` naming the choices."""
    choices = CHOICES[variable]
    chosen = value.strip().lower()
    if not chosen:
        return choices[0]
    if chosen not in choices:
        raise ConfigError(variable, value, ", ".join(choices))
    return chosen


def choice(variable: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of the choice variable ``variable`` (see :data:`CHOICES`) in the environment."""
    env = os.environ if environ is None else environ
    return parse_choice(variable, env.get(variable, ""))


def from_environment(
    environ: Mapping[str, str] | None = None,
    *,
    enable: Sequence[str] | str | None = None,
    disable: Sequence[str] | str | None = None,
    force: Sequence[str] | str | None = None,
    strict: bool | None = None,
) -> Settings:
    """Parse every ``PATCHKIT_*`` variable: explicit arguments win over the environment, which wins
    over the defaults. The one parser of these variables: the engine, autoload, the launcher and the
    CLI all read them here.

    Raises ``ConfigError`` naming the variable and the accepted forms for a malformed value.
    """
    env = os.environ if environ is None else environ

    def patterns(variable: str, explicit: Sequence[str] | str | None) -> tuple[str, ...] | None:
        if explicit is not None:
            return parse_patterns(f"argument {variable.removeprefix('PATCHKIT_').lower()}", explicit)
        raw = _present(variable, env.get(variable), _PATTERN_FORM)
        return None if raw is None else parse_patterns(variable, raw)

    raw_level = env.get(LOG_LEVEL)
    return Settings(
        enable=patterns(ENABLE, enable),
        disable=patterns(DISABLE, disable) or (),
        force=patterns(FORCE, force) or (),
        strict=strict if strict is not None else parse_bool(STRICT, env.get(STRICT, "")),
        log_level=None if raw_level is None or raw_level == "" else parse_log_level(LOG_LEVEL, raw_level),
        autoload=parse_bool(AUTOLOAD, env.get(AUTOLOAD, "")),
        extra_patches=parse_modules(EXTRA_PATCHES, env.get(EXTRA_PATCHES, "")),
        manifest_dir=parse_folder(MANIFEST_DIR, env.get(MANIFEST_DIR, "")),
    )


def strict_requested(environ: Mapping[str, str] | None = None, explicit: bool | None = None) -> bool:
    """Whether strict mode is asked for: the argument, else ``PATCHKIT_STRICT``. A malformed
    ``PATCHKIT_STRICT`` cannot ask for strictness: it counts as off (and is reported as a config error
    by whoever parses the settings)."""
    if explicit is not None:
        return explicit
    env = os.environ if environ is None else environ
    try:
        return parse_bool(STRICT, env.get(STRICT, ""))
    except ConfigError:
        return False


def fingerprint_cache_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the on-disk fingerprint cache may be used: ``PATCHKIT_FINGERPRINT_CACHE``, on when unset.
    A malformed value turns it off: the cache only saves time, and off is the side that trusts nothing."""
    env = os.environ if environ is None else environ
    raw = env.get(FINGERPRINT_CACHE, "")
    if raw == "":
        return True
    try:
        return parse_bool(FINGERPRINT_CACHE, raw)
    except ConfigError:
        return False


def check_known(settings: Settings, known_ids: Sequence[str]) -> list[str]:
    """Raise ``UnknownPatchError`` for a plain id that is not registered (with the closest ids).

    Returns warnings for globs that match nothing: harmless, but likely a typo.
    """
    warnings = []
    for variable, patterns in ((ENABLE, settings.enable or ()), (DISABLE, settings.disable), (FORCE, settings.force)):
        for pattern in patterns:
            if is_glob(pattern):
                if not any(fnmatch.fnmatchcase(known, pattern) for known in known_ids):
                    warnings.append(f"{variable}: {pattern!r} matches no known patch")
            elif pattern not in known_ids:
                import difflib

                close = difflib.get_close_matches(pattern, known_ids, n=3, cutoff=0.5)
                raise UnknownPatchError(variable, pattern, close)
    return warnings
