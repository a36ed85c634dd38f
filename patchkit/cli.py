"""The ``patchkit`` command: list, status, explain, doctor, run, matrix (docs/cli.md describes each).

Only what a subcommand needs is imported when it runs: the matrix tooling (PyYAML, ``packaging``) is
an optional extra, so every other subcommand works without it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING, Iterator, Sequence

import patchkit

from . import output_format
from .doctor.cli import add_parser as add_doctor_parser
from .runtime.errors import ConfigError, PatchkitError, PatchkitWarning

if TYPE_CHECKING:
    from .doctor.environment import Problem

DESCRIPTION = ("Versioned, reversible patches for Megatron-Core, Megatron-Bridge, ModelOpt and vLLM: list them, "
               "see their state in this environment, check that they do their job, run a command with them "
               "applied in every process, and keep the compatibility matrix.")
EPILOG = ("Exit status: 0 all well; 1 a patch failed, a self-check failed or an upstream does not import; "
          "2 bad input or a configuration error (status, doctor); 141 stdout was closed early. "
          "Documentation: docs/cli.md and docs/configuration.md.")

#: The status of a process whose reader closed its stdout early, as for one ended by SIGPIPE.
EXIT_BROKEN_PIPE = 141
EXIT_USAGE = 2
#: The tooling modules the matrix commands need, and the extra that installs them.
TOOLING_MODULES = ("yaml", "packaging")
TOOLING_EXTRA = "matrix"


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")


def distribution_name() -> str:
    """The name this copy of patchkit is installed under, read from its own metadata (the import
    name when it is run from a source tree that is not installed). Where several installed
    distributions provide the package at this version (a renamed distribution left behind by an
    in-place upgrade), the one installed last."""
    import importlib.metadata

    package = __name__.partition(".")[0]
    try:
        names = dict.fromkeys(importlib.metadata.packages_distributions().get(package, []))
    except Exception:  # noqa: BLE001 - unreadable metadata elsewhere must not break --version
        names = {}
    found: list[tuple[float, str]] = []
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError, OSError):
            dist = importlib.metadata.distribution(name)
            if dist.version == patchkit.__version__:
                where = getattr(dist, "_path", None)  # the .dist-info folder of a path distribution
                found.append((os.stat(where).st_mtime if where is not None else 0.0, name))
    if found:
        return max(found)[1]
    return next(iter(names), package)


def _version_text() -> str:
    where = os.path.dirname(os.path.abspath(patchkit.__file__))
    return f"{distribution_name()} {patchkit.__version__} (import package patchkit at {where})"


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send whatever writes to stdout meanwhile to stderr, at the file-descriptor level.

    Upstreams print while being imported (vLLM's logger writes to stdout; a C extension may write
    to fd 1 directly): stdout is kept for our report, so ``status --json`` stays parseable.
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 (a closed stdout): nothing to protect
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)


def _flush_c_stdio() -> None:
    """Flush C stdio buffers (``printf`` from an extension) while fd 1 still points to stderr."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library to ask (Windows): nothing buffered there
        pass


def _registered() -> "patchkit.Engine":
    """The engine with the catalogue and ``PATCHKIT_EXTRA_PATCHES`` registered, as ``apply_all`` sees it."""
    with _stdout_to_stderr():
        patchkit.register_extra_patches()
    return patchkit.engine()


def config_problems(engine: "patchkit.Engine") -> tuple[ConfigError, ...]:
    """Every problem of the ``PATCHKIT_*`` variables here, against the registered ids."""
    from .runtime import settings

    return settings.read(known_ids=engine.ids()).problems


def _say_config_problems(problems: Sequence[ConfigError]) -> None:
    """Each problem on stderr, in one line naming the variable and what it costs. The command says
    them itself (and holds back the ``PatchkitWarning`` that would point at its own code)."""
    from .runtime.settings import consequence

    for problem in problems:
        sys.stderr.write(f"patchkit: configuration: {problem} ({consequence(problem)})\n")


def _verbose(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "verbose", False))


def _list(args: argparse.Namespace) -> int:
    from .report import describe, patch_dict

    eng = _registered()
    if args.json:
        _write(json.dumps([patch_dict(eng.patch(patch_id)) for patch_id in eng.ids()], indent=1))
        return 0
    for patch_id in eng.ids():
        _write(describe(eng.patch(patch_id)))
    return 0


def _upstreams(eng: "patchkit.Engine") -> dict[str, str]:
    from .doctor.runner import upstream_of

    found = {patch_id: upstream_of(eng.patch(patch_id)) for patch_id in eng.ids()}
    return {patch_id: dist for patch_id, dist in found.items() if dist}


def _blocked_notes(records: Sequence["patchkit.PatchStatus"], upstreams: dict[str, str],
                   problems: Sequence["Problem"]) -> dict[str, str]:
    from .doctor import environment

    notes = {}
    for record in records:
        problem = environment.blocked_by(record, upstreams.get(record.id), problems)
        if problem is not None:
            notes[record.id] = f"blocked: {problem.distribution} does not import (environment problem)"
    return notes


def _status(args: argparse.Namespace) -> int:
    from .doctor import environment
    from .report import status_json, status_markdown, status_table
    from .upstream_output import captured, real_stderr

    chosen = output_format.chosen(args)
    verbose = _verbose(args)
    eng = _registered()
    upstreams = _upstreams(eng)
    problems: list[environment.Problem] = []
    report = real_stderr()
    try:
        # Importing the targets makes upstreams print (warnings, deprecation notices): kept out of the report.
        with captured(report) as upstream:
            patchkit.apply_all()
            if args.no_import:
                records = eng.status()
            else:
                progress = report if (report.isatty() or verbose) else None
                optional: dict[str, environment.OptionalDependency] = {}
                problems = environment.import_upstreams(eng.status(), upstreams, progress, optional)
                # Patches of a module that needs a package not installed here stay waiting, as in a job.
                leave = [s.id for s in eng.status() if any(m in optional for m in s.waiting_for)]
                with environment.said_once(problems, upstreams):
                    records = eng.import_targets(leave)
    finally:
        report.close()
    notes = _blocked_notes(records, upstreams, problems)
    stack = environment.header(environment.stack({d for i in eng.ids() for d in eng.patch(i).distributions}),
                               "status")
    said = [line for problem in problems for line in problem.lines()]
    if chosen == "json":
        _write(status_json(records))
    elif chosen == "markdown":
        _write(status_markdown(records, stack + said, notes))
    else:
        _write("\n".join(stack + said + [status_table(records, full=verbose, notes=notes)]))
    sys.stdout.flush()
    if upstream.lines and (args.upstream_output or verbose):
        sys.stderr.write(f"--- upstream output while importing the targets ({upstream.lines} lines) ---\n"
                         f"{upstream.text.rstrip()}\n")
    elif upstream.lines:
        sys.stderr.write(f"status: upstreams printed {upstream.lines} line(s) while imported "
                         "(`patchkit status --upstream-output` shows them)\n")
    return 1 if any(r.state.value == "failed" for r in records) else 0


def _explain(args: argparse.Namespace) -> int:
    from .report import describe, patch_dict

    eng = _registered()
    patch = eng.patch(args.id)  # an unknown id: UnknownPatchError, exit 2
    with _stdout_to_stderr():
        patchkit.apply_all()
    (record,) = eng.status(args.id)
    if args.json:
        _write(json.dumps({**patch_dict(patch), "status": record.to_dict()}, indent=1))
        return 0
    _write(describe(patch, verbose=True))
    _write(f"  in this interpreter: {record.state.value}"
           + (f" ({record.reason.value})" if record.reason else "")
           + (f": {record.error or record.detail}" if record.error or record.detail else ""))
    return 0


def _run(args: argparse.Namespace) -> int:
    from .processes.launcher import run

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        sys.stderr.write("patchkit run: give the command after --, e.g. `patchkit run -- python train.py`\n")
        return 2
    return run(command)


def _matrix(args: argparse.Namespace) -> int:
    """``patchkit matrix ...``: its own parser, imported only now (it needs the tooling extra)."""
    from .matrix.cli import build_parser as build_matrix_parser

    chosen = build_matrix_parser().parse_args(args.matrix_args)
    code: int = chosen.run(chosen)
    return code


def build_parser() -> argparse.ArgumentParser:
    # -v means one thing wherever it is given: say more (patchkit's log at INFO, progress on stderr,
    # reasons in full instead of cut to the terminal, what upstreams printed).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="say more: patchkit's log, progress, full reasons, what upstreams printed")
    parser = argparse.ArgumentParser(prog="patchkit", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("-v", "--verbose", action="store_true", default=False,
                        help="say more: patchkit's log, progress, full reasons, what upstreams printed")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="the installed distribution's name and version, and where it is")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    matrix = commands.add_parser("matrix", help="compat_matrix.yaml: check, record, static, merge, table "
                                                "(needs the matrix extra)", add_help=False, prefix_chars="\0")
    matrix.add_argument("matrix_args", nargs=argparse.REMAINDER)
    matrix.set_defaults(run=_matrix)
    add_doctor_parser(commands, common)  # `patchkit doctor`, in patchkit/doctor/cli.py
    listing = commands.add_parser("list", parents=[common], help="every patch: targets, ranges, removal plan")
    listing.add_argument("--json", action="store_true", help="machine-readable declarations")
    listing.set_defaults(run=_list, config="say")
    status = commands.add_parser("status", parents=[common], help="apply here, against what is installed, and report",
                                 description="Apply the patches against what is installed, import the upstreams "
                                             "and report each patch's state. Exit status: 0 all well, 1 a patch "
                                             "failed or an upstream does not import, 2 a configuration error.")
    output_format.add_options(status, json_help="machine-readable records (as --format json)")
    status.add_argument("--upstream-output", action="store_true",
                        help="after the report, show what upstreams printed while their modules were imported "
                             "(also shown with --verbose)")
    status.add_argument("--no-import", action="store_true",
                        help="do not import target modules: show what waits for an import as pending")
    status.set_defaults(run=_status, config="fail")
    explain = commands.add_parser("explain", parents=[common], help="one patch in full, and its state here")
    explain.add_argument("id")
    explain.add_argument("--json", action="store_true", help="the declaration and its status, machine-readable")
    explain.set_defaults(run=_explain, config="say")
    launch = commands.add_parser("run", help="run a command with every Python process it starts autoloading patches",
                                 usage="patchkit run -- COMMAND [ARGS...]")
    launch.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    launch.set_defaults(run=_run)
    commands.choices["doctor"].set_defaults(config="fail")
    return parser


class _Version(argparse.Action):
    """``--version``, with the metadata read only when asked for (it scans every installed distribution)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        _write(_version_text())
        parser.exit()


def _silence_stdout() -> None:
    """After a closed pipe: point stdout at the null device, so the flush at exit raises nothing
    (the recipe of Python's documentation of SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no fd to repoint: nothing will be flushed to it
        pass


def _missing_tooling(exc: ModuleNotFoundError) -> bool:
    return (exc.name or "").partition(".")[0] in TOOLING_MODULES


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # --help, --version, a usage error: what it wrote must reach a closed pipe now
        sys.stdout.flush()
        raise
    logging.basicConfig(level=logging.INFO if _verbose(args) else logging.WARNING, format="%(message)s")
    problems: tuple[ConfigError, ...] = ()
    try:
        with warnings.catch_warnings():
            # The command says configuration problems itself, once, naming the variable, and its
            # logging shows the others: a PatchkitWarning would repeat them, pointing at this code.
            warnings.filterwarnings("ignore", category=PatchkitWarning)
            if getattr(args, "config", None):
                problems = config_problems(_registered())
                _say_config_problems(problems)
            status = int(args.run(args))
        sys.stdout.flush()
    except PatchkitError as exc:
        # One line: a matrix error with a single problem is that problem (it names file:line:column).
        found = getattr(exc, "problems", None)
        sys.stderr.write(f"patchkit: {found[0] if found and len(found) == 1 else exc}\n")
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        if not _missing_tooling(exc):
            raise
        sys.stderr.write(f"patchkit: {args.command} needs PyYAML and packaging ({exc}): "
                         f"pip install '{distribution_name()}[{TOOLING_EXTRA}]'\n")
        return EXIT_USAGE
    if problems and getattr(args, "config", None) == "fail":
        status = EXIT_USAGE
    exit_process = getattr(args, "exit_process", None)
    if argv is None and exit_process is not None:  # the process's own command line, not a caller's
        exit_process(status)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """The ``patchkit`` console script; returns the exit status. A reader that closes stdout early
    (``patchkit list | head -1``) ends the command quietly with status 141."""
    try:
        return _main(argv)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
