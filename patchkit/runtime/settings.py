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
}

_PATTERN_FORM = "comma-separated patch ids or globs, e.g. 'megatron.mtp_postprocess,vllm.*' or '*'"
_PATTERN = re.compile(r"^[a-z0-9_.*?]+$|^[a-z0-9_.*?]*\[[a-z0-9_.!-]+\][a-z0-9_.*?]*$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Settings(NamedTuple):
    """The toggles in force for one ``apply_all()`` call."""

    enable: tuple[str, ...] | None = None  #: None: no restriction
    disable: tuple[str, ...] = ()
    force: tuple[str, ...] = ()
    strict: bool = False
    log_level: int | None = None

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


def parse_patterns(variable: str, value: str | Sequence[str]) -> tuple[str, ...]:
    """Split a comma-separated list of ids/globs (or take a sequence); reject what cannot be one."""
    tokens = [token.strip() for token in (value.split(",") if isinstance(value, str) else value)]
    shown = value if isinstance(value, str) else ",".join(value)
    for token in tokens:
        if not token:
            raise ConfigError(variable, shown, _PATTERN_FORM, problem="malformed (empty entry)")
        if not _PATTERN.match(token) or ".." in token or token.startswith("."):
            raise ConfigError(variable, shown, _PATTERN_FORM, problem=f"malformed (bad entry {token!r})")
    return tuple(tokens)


def parse_bool(variable: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(variable, value, "1, true, yes, on, 0, false, no, off")


_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_modules(variable: str, value: str) -> tuple[str, ...]:
    """Split a comma-separated list of dotted module names; reject what cannot be one."""
    tokens = tuple(token.strip() for token in value.split(",")) if value.strip() else ()
    for token in tokens:
        if not _MODULE.match(token):
            raise ConfigError(variable, value, "comma-separated dotted module names, e.g. 'mypkg.patches,other.decl'",
                              problem=f"malformed (bad entry {token!r})")
    return tokens


def parse_log_level(variable: str, value: str) -> int:
    text = value.strip().upper()
    if text in _LEVELS:
        return int(getattr(logging, text))
    if text.isdigit() and 0 <= int(text) <= 50:
        return int(text)
    raise ConfigError(variable, value, f"{', '.join(_LEVELS)} or an integer 0-50")


def from_environment(
    environ: Mapping[str, str] | None = None,
    *,
    enable: Sequence[str] | str | None = None,
    disable: Sequence[str] | str | None = None,
    force: Sequence[str] | str | None = None,
    strict: bool | None = None,
) -> Settings:
    """Build the settings: explicit arguments win over the environment, which wins over defaults.

    Raises ``ConfigError`` naming the variable and the accepted forms for a malformed value.
    """
    env = os.environ if environ is None else environ

    def patterns(variable: str, explicit: Sequence[str] | str | None) -> tuple[str, ...] | None:
        if explicit is not None:
            return parse_patterns(f"argument {variable.removeprefix('PATCHKIT_').lower()}", explicit)
        raw = env.get(variable)
        return None if raw is None or not raw.strip() else parse_patterns(variable, raw)

    raw_level = env.get(LOG_LEVEL)
    return Settings(
        enable=patterns(ENABLE, enable),
        disable=patterns(DISABLE, disable) or (),
        force=patterns(FORCE, force) or (),
        strict=strict if strict is not None else parse_bool(STRICT, env.get(STRICT, "")),
        log_level=None if raw_level is None or not raw_level.strip() else parse_log_level(LOG_LEVEL, raw_level),
    )


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
