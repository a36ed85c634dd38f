"""The ``PATCHKIT_*`` environment variables, parsed and validated in one place.

Precedence is explicit argument > environment > default. Values are read once per ``apply_all()``
call, never on a hot path.

A bad value turns off only what it is about (:func:`read` collects every problem, each with what it
costs): an unreadable log level keeps the default level, an unknown id in a list is ignored (with the
closest ids), a misspelled variable name is pointed at the documented one. Only the switches that say
which patches may apply (``PATCHKIT_DISABLE``, ``PATCHKIT_ENABLE``, ``PATCHKIT_AUTOLOAD``) apply nothing
when their value cannot be read at all: patchkit cannot tell which patches they were meant to turn off.
"""

from __future__ import annotations

import os

from .errors import ConfigError, UnknownPatchError, UnknownVariableError
from .records import Record

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Callable, Iterable, Mapping, Sequence, TypeVar

    T = TypeVar("T")

DISABLE = "PATCHKIT_DISABLE"
ENABLE = "PATCHKIT_ENABLE"
OPT_IN = "PATCHKIT_OPT_IN"
STRICT = "PATCHKIT_STRICT"
FORCE = "PATCHKIT_FORCE"
LOG_LEVEL = "PATCHKIT_LOG_LEVEL"
AUTOLOAD = "PATCHKIT_AUTOLOAD"
EXTRA_PATCHES = "PATCHKIT_EXTRA_PATCHES"
MANIFEST_DIR = "PATCHKIT_MANIFEST_DIR"
FINGERPRINT_CACHE = "PATCHKIT_FINGERPRINT_CACHE"
REFIT_ALLOW_NON_FINITE = "PATCHKIT_REFIT_ALLOW_NON_FINITE"
GRAD_ALLREDUCE_CHUNK_BYTES = "PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES"

#: Documented in the README; every variable patchkit reads.
VARIABLES: Mapping[str, str] = {
    DISABLE: "comma-separated patch ids or globs not to apply ('*' = all); reverts them if already applied",
    ENABLE: "comma-separated ids or globs: apply only these (an opt-in patch only when named by its exact id)",
    OPT_IN: "comma-separated ids or globs: also apply these opt-in patches; restricts nothing else",
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
    REFIT_ALLOW_NON_FINITE: "1/true/yes/on or 0/false/no/off (the default): every vLLM refit in the process "
                            "loads NaN/Inf weights and scales as vLLM does, instead of refusing them",
    GRAD_ALLREDUCE_CHUNK_BYTES: "a positive number of bytes (default 1073741824, 1 GiB): the most one "
                                "tensor-parallel gradient all-reduce carries under megatron.chunked_tp_grad_allreduce",
}

#: What :data:`GRAD_ALLREDUCE_CHUNK_BYTES` is when unset (slime's default).
DEFAULT_GRAD_ALLREDUCE_CHUNK_BYTES = 1 << 30

MTP_OUTPUT_HEAD = "PATCHKIT_MTP_OUTPUT_HEAD"
MTP_WITHOUT_LABELS = "PATCHKIT_MTP_WITHOUT_LABELS"
RAY_STORE_PORT_WINDOW = "PATCHKIT_RAY_STORE_PORT_WINDOW"

#: Variables a catalogue patch reads (on first use, not at ``apply_all()``), each naming one of a few
#: choices; parsed here by :func:`choice` like every other ``PATCHKIT_*`` variable. The first choice is
#: the default. What each choice does is the patch's to document (patches/megatron/mtp/_options.py).
CHOICES: Mapping[str, tuple[str, ...]] = {
    MTP_OUTPUT_HEAD: ("detached", "trained"),
    MTP_WITHOUT_LABELS: ("skip", "derive", "derive-mask-as-given"),
    RAY_STORE_PORT_WINDOW: ("not-data-parallel", "always"),
}

#: The switches that say which patches may apply: a value that cannot be read at all applies nothing.
SWITCHES = (DISABLE, ENABLE, AUTOLOAD)

#: ``PATCHKIT_*`` names that are not settings and are never warned about: autoload's own marker, and
#: the variables the repository's test and CI tooling reads.
NOT_SETTINGS = frozenset({"PATCHKIT_AUTOLOAD_ACTIVE", "PATCHKIT_REPORTS", "PATCHKIT_UNPINNED", "PATCHKIT_ROOT",
                          "PATCHKIT_GPU_REPORT", "PATCHKIT_TEST_REAL_SIGNALS", "PATCHKIT_INTERRUPT_STRIDE"})

_PATTERN_FORM = "comma-separated patch ids or globs, e.g. 'megatron.mtp_postprocess,vllm.*' or '*'"
# Patterns are compiled by `re` when first used (and cached there): compiling them all costs start-up time.
_PATTERN = r"^[a-z0-9_.*?]+$|^[a-z0-9_.*?]*\[[a-z0-9_.!-]+\][a-z0-9_.*?]*$"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_BOOL_FORM = "1, true, yes, on, 0, false, no, off"
#: ``logging``'s level names and numbers (fixed by its documentation), so that reading them imports no ``logging``.
_LEVEL_NUMBERS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
_LEVELS = tuple(_LEVEL_NUMBERS)


class Settings(Record):
    """Every ``PATCHKIT_*`` toggle, parsed: what one ``apply_all()`` call (or autoload) uses."""

    enable: tuple[str, ...] | None = None  #: None: no restriction
    disable: tuple[str, ...] = ()
    opt_in: tuple[str, ...] = ()
    force: tuple[str, ...] = ()
    strict: bool = False
    log_level: int | None = None
    autoload: bool = False
    extra_patches: tuple[str, ...] = ()
    manifest_dir: str | None = None

    def is_enabled(self, patch_id: str, opt_in: bool) -> bool:
        """An opt-in patch: named in ``opt_in`` (id or glob), or by its exact id in ``enable`` (a glob
        there never turns on a behaviour change). Any other patch: ``enable`` unset, or matching it."""
        if opt_in:
            return matches_any(patch_id, self.opt_in) or patch_id in (self.enable or ())
        return self.enable is None or matches_any(patch_id, self.enable)

    def is_disabled(self, patch_id: str) -> bool:
        return matches_any(patch_id, self.disable)

    def is_forced(self, patch_id: str) -> bool:
        return matches_any(patch_id, self.force)


def matches_any(patch_id: str, patterns: Iterable[str]) -> bool:
    if not patterns:  # the usual case, asked for every patch at start-up
        return False
    import fnmatch  # only where a pattern is given: it imports `re`, which start-up does not

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
    import re  # only where a value is given: start-up does not import it

    for token in tokens:
        if not token:
            raise ConfigError(variable, shown, _PATTERN_FORM, problem="malformed (empty entry)")
        if not re.fullmatch(_PATTERN, token, re.ASCII) or ".." in token or token.startswith("."):
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


_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
_MODULE_FORM = "comma-separated dotted module names, e.g. 'mypkg.patches,other.decl'"


def parse_modules(variable: str, value: str) -> tuple[str, ...]:
    """Split a comma-separated list of dotted module names; reject what cannot be one."""
    present = _present(variable, value, _MODULE_FORM)
    if present is None:
        return ()
    tokens = tuple(token.strip() for token in present.split(","))
    import re  # only where a value is given: start-up does not import it

    for token in tokens:
        if not token:
            raise ConfigError(variable, value, _MODULE_FORM, problem="malformed (empty entry)")
        if not re.fullmatch(_MODULE, token, re.ASCII):
            raise ConfigError(variable, value, _MODULE_FORM, problem=f"malformed (bad entry {token!r})")
    return tokens


_LEVEL_FORM = f"{', '.join(_LEVELS)} or an integer 0-50"
#: ASCII digits only: str.isdigit() and int() also take '²', '１０' and '٣'.
_LEVEL_NUMBER = r"^[0-9]{1,2}$"


def parse_log_level(variable: str, value: str) -> int:
    present = _present(variable, value, _LEVEL_FORM)
    text = (present or "").strip().upper()
    if text in _LEVELS:
        return _LEVEL_NUMBERS[text]
    import re  # only for a level given as a number

    if re.fullmatch(_LEVEL_NUMBER, text, re.ASCII) and int(text) <= 50:
        return int(text)
    raise ConfigError(variable, value, _LEVEL_FORM)


_BYTES_FORM = "a positive whole number of bytes, e.g. 268435456"


def parse_byte_count(variable: str, value: str) -> int | None:
    """A positive whole number of bytes (surrounding spaces allowed); None if unset or empty."""
    present = _present(variable, value, _BYTES_FORM)
    if present is None:
        return None
    digits = present.strip()
    if not digits.isascii() or not digits.isdigit() or int(digits) <= 0:
        raise ConfigError(variable, value, _BYTES_FORM)
    return int(digits)


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


class Reading(Record):
    """The settings :func:`read` could make out, and every problem met on the way."""

    settings: Settings
    #: Each bad value or name, in the order read; each :func:`consequence` says what it costs.
    problems: tuple[ConfigError, ...] = ()
    #: The first switch (:data:`SWITCHES`) whose value could not be read: nothing may be applied.
    blocking: ConfigError | None = None


def read(
    environ: Mapping[str, str] | None = None,
    *,
    known_ids: Sequence[str] | None = None,
    enable: Sequence[str] | str | None = None,
    disable: Sequence[str] | str | None = None,
    force: Sequence[str] | str | None = None,
    opt_in: Sequence[str] | str | None = None,
    strict: bool | None = None,
) -> Reading:
    """Parse every ``PATCHKIT_*`` variable, collecting problems instead of stopping at the first.

    Explicit arguments win over the environment, which wins over the defaults; an explicit argument
    is code, so a bad one raises ``ConfigError`` (``UnknownPatchError`` for an unknown id) at once.
    A bad environment value costs only what it is about (see :func:`consequence`). With
    ``known_ids``, ids that are not registered and globs that match nothing are problems too, and
    ``PATCHKIT_*`` names that patchkit does not read are problems naming the closest documented one.
    """
    env = os.environ if environ is None else environ
    problems: list[ConfigError] = []
    blocking: list[ConfigError] = []

    def attempt(variable: str, parse: Callable[[], T], fallback: T) -> T:
        try:
            return parse()
        except ConfigError as exc:
            problems.append(exc)
            if variable in SWITCHES:
                blocking.append(exc)
            return fallback

    def patterns(variable: str, explicit: Sequence[str] | str | None) -> tuple[str, ...] | None:
        if explicit is not None:
            chosen = parse_patterns(f"argument {variable.removeprefix('PATCHKIT_').lower()}", explicit)
            if known_ids is not None:
                for pattern in chosen:
                    if not is_glob(pattern) and pattern not in known_ids:
                        raise UnknownPatchError(variable, pattern, _closest(pattern, known_ids))
            return chosen

        def parse() -> tuple[str, ...] | None:
            raw = _present(variable, env.get(variable), _PATTERN_FORM)
            return None if raw is None else parse_patterns(variable, raw)

        found = attempt(variable, parse, None)
        if found is None or known_ids is None:
            return found
        import fnmatch

        kept = []
        for pattern in found:
            if not is_glob(pattern) and pattern not in known_ids:
                problems.append(UnknownPatchError(variable, pattern, _closest(pattern, known_ids)))
            elif is_glob(pattern) and not any(fnmatch.fnmatchcase(known, pattern) for known in known_ids):
                problems.append(ConfigError(variable, pattern, _PATTERN_FORM, problem="a glob matching no known patch"))
            else:
                kept.append(pattern)
        return tuple(kept)

    def level() -> int | None:
        raw = env.get(LOG_LEVEL)
        return None if raw is None or raw == "" else parse_log_level(LOG_LEVEL, raw)

    chosen = Settings(
        enable=patterns(ENABLE, enable),
        disable=patterns(DISABLE, disable) or (),
        opt_in=patterns(OPT_IN, opt_in) or (),
        force=patterns(FORCE, force) or (),
        strict=strict if strict is not None else attempt(STRICT, lambda: parse_bool(STRICT, env.get(STRICT, "")),
                                                         False),
        log_level=attempt(LOG_LEVEL, level, None),
        autoload=attempt(AUTOLOAD, lambda: parse_bool(AUTOLOAD, env.get(AUTOLOAD, "")), False),
        extra_patches=attempt(EXTRA_PATCHES, lambda: parse_modules(EXTRA_PATCHES, env.get(EXTRA_PATCHES, "")), ()),
        manifest_dir=attempt(MANIFEST_DIR, lambda: parse_folder(MANIFEST_DIR, env.get(MANIFEST_DIR, "")), None),
    )
    attempt(FINGERPRINT_CACHE, lambda: _cache_flag(env), True)
    attempt(REFIT_ALLOW_NON_FINITE, lambda: parse_bool(REFIT_ALLOW_NON_FINITE, env.get(REFIT_ALLOW_NON_FINITE, "")),
            False)
    attempt(GRAD_ALLREDUCE_CHUNK_BYTES,
            lambda: parse_byte_count(GRAD_ALLREDUCE_CHUNK_BYTES, env.get(GRAD_ALLREDUCE_CHUNK_BYTES, "")), None)
    for variable in CHOICES:
        attempt(variable, lambda name=variable: choice(name, env), "")  # type: ignore[misc]
    if known_ids is not None:
        problems.extend(unknown_variables(env))
    return Reading(chosen, tuple(problems), blocking[0] if blocking else None)


def _cache_flag(env: Mapping[str, str]) -> bool:
    raw = env.get(FINGERPRINT_CACHE, "")
    return True if raw == "" else parse_bool(FINGERPRINT_CACHE, raw)


def _closest(name: str, known: Iterable[str]) -> list[str]:
    import difflib  # only for a misspelled name

    return difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)


def documented() -> tuple[str, ...]:
    """Every ``PATCHKIT_*`` variable a user may set (docs/configuration.md describes each)."""
    return (*VARIABLES, *CHOICES)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[UnknownVariableError]:
    """The ``PATCHKIT_*`` names set in the environment that patchkit does not read, each with the
    closest documented names (a misspelled ``PATCHKIT_DISABLED`` is otherwise ignored without a word)."""
    env = os.environ if environ is None else environ
    known = documented()
    # A prefix test and set difference: apply_all() runs this on every call, an environment holds
    # hundreds of names, and fnmatch would compile a pattern for it at start-up.
    unknown = {name for name in env if name.startswith("PATCHKIT_")} - set(known) - NOT_SETTINGS
    return [UnknownVariableError(name, env[name], _closest(name, known)) for name in sorted(unknown)]


#: What a bad value of each variable costs, said with the problem so the user knows what still holds.
_CONSEQUENCES: Mapping[str, str] = {
    DISABLE: "nothing applied: patchkit cannot tell which patches it was meant to turn off",
    ENABLE: "nothing applied: patchkit cannot tell which patches it was meant to allow",
    AUTOLOAD: "nothing applied: patchkit cannot tell whether it was meant to stand aside",
    OPT_IN: "no opt-in patch turned on by it",
    FORCE: "nothing forced by it",
    STRICT: "strict mode is off",
    LOG_LEVEL: "the 'patchkit' logger keeps its level",
    EXTRA_PATCHES: "no extra declaration module registered",
    MANIFEST_DIR: "no manifest written",
    FINGERPRINT_CACHE: "the fingerprint cache is off",
    REFIT_ALLOW_NON_FINITE: "vLLM refits refuse non-finite values",
    GRAD_ALLREDUCE_CHUNK_BYTES: "chunked gradient all-reduces use the default chunk (1 GiB)",
}


def consequence(problem: ConfigError) -> str:
    """What ``problem`` turns off, in a few words; every other setting and patch is unaffected."""
    if isinstance(problem, UnknownVariableError):
        return "ignored: patchkit does not read this variable"
    if isinstance(problem, UnknownPatchError) or "matching no known patch" in str(problem):
        return "this entry is ignored, every other entry applies"
    if problem.variable in CHOICES:
        return f"{problem.variable} falls back to {CHOICES[problem.variable][0]!r} when the patch reads it"
    return _CONSEQUENCES.get(problem.variable, "ignored")


def from_environment(
    environ: Mapping[str, str] | None = None,
    *,
    enable: Sequence[str] | str | None = None,
    disable: Sequence[str] | str | None = None,
    force: Sequence[str] | str | None = None,
    opt_in: Sequence[str] | str | None = None,
    strict: bool | None = None,
) -> Settings:
    """Parse every ``PATCHKIT_*`` variable, strictly: the one parser of these variables (the engine,
    autoload, the launcher and the CLI all read them here, through :func:`read`).

    Raises ``ConfigError`` naming the variable and the accepted forms for the first malformed value.
    """
    reading = read(environ, enable=enable, disable=disable, force=force, opt_in=opt_in, strict=strict)
    if reading.problems:
        raise reading.problems[0]
    return reading.settings


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
    import fnmatch

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


def refit_allows_non_finite(environ: Mapping[str, str] | None = None) -> bool:
    """Whether vLLM refits load NaN/Inf values (``PATCHKIT_REFIT_ALLOW_NON_FINITE``), off when unset. A
    malformed value keeps it off: refusing them is the side that changes no weight."""
    env = os.environ if environ is None else environ
    try:
        return parse_bool(REFIT_ALLOW_NON_FINITE, env.get(REFIT_ALLOW_NON_FINITE, ""))
    except ConfigError:
        return False


def grad_allreduce_chunk_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The most bytes one chunked tensor-parallel gradient all-reduce carries
    (``PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES``), :data:`DEFAULT_GRAD_ALLREDUCE_CHUNK_BYTES` when unset. A
    malformed value gives the default (``apply_all()`` reports it): the chunk only bounds memory."""
    env = os.environ if environ is None else environ
    try:
        chosen = parse_byte_count(GRAD_ALLREDUCE_CHUNK_BYTES, env.get(GRAD_ALLREDUCE_CHUNK_BYTES, ""))
    except ConfigError:
        chosen = None
    return DEFAULT_GRAD_ALLREDUCE_CHUNK_BYTES if chosen is None else chosen
