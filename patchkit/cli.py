"""The ``patchkit`` command: list, status, explain, doctor, run, matrix."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Iterator, Sequence

import patchkit

from .doctor.cli import add_parser as add_doctor_parser
from .matrix.cli import add_parser as add_matrix_parser
from .report import describe, status_json, status_table
from .runtime.errors import PatchkitError


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")


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


def _list(args: argparse.Namespace) -> int:
    eng = _registered()
    for patch_id in eng.ids():
        _write(describe(eng.patch(patch_id)))
    return 0


def _status(args: argparse.Namespace) -> int:
    from .upstream_output import captured, real_stderr

    eng = patchkit.engine()
    report = real_stderr()
    try:
        # Importing the targets makes upstreams print (warnings, deprecation notices): kept out of the report.
        with captured(report) as upstream:
            patchkit.apply_all()
            records = eng.status() if args.no_import else eng.import_targets()
    finally:
        report.close()
    _write(status_json(records) if args.json else status_table(records))
    if upstream.lines and args.upstream_output:
        sys.stderr.write(f"--- upstream output while importing the targets ({upstream.lines} lines) ---\n"
                         f"{upstream.text.rstrip()}\n")
    elif upstream.lines:
        sys.stderr.write(f"status: upstreams printed {upstream.lines} line(s) while imported "
                         "(`patchkit status --upstream-output` shows them)\n")
    return 1 if any(r.state.value == "failed" for r in records) else 0


def _explain(args: argparse.Namespace) -> int:
    eng = _registered()
    patch = eng.patch(args.id)  # an unknown id: UnknownPatchError, exit 2
    with _stdout_to_stderr():
        patchkit.apply_all()
    _write(describe(patch, verbose=True))
    (record,) = eng.status(args.id)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="patchkit", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what patchkit does to stderr")
    commands = parser.add_subparsers(dest="command", required=True)
    add_matrix_parser(commands)  # `patchkit matrix check | record | static | merge | table`, in patchkit/matrix/cli.py
    add_doctor_parser(commands)  # `patchkit doctor`, in patchkit/doctor/cli.py
    commands.add_parser("list", help="every patch: targets, ranges, removal plan").set_defaults(run=_list)
    status = commands.add_parser("status", help="apply here, against what is installed, and report")
    status.add_argument("--json", action="store_true", help="machine-readable records")
    status.add_argument("--upstream-output", action="store_true",
                        help="after the report, show what upstreams printed while their modules were imported")
    status.add_argument("--no-import", action="store_true",
                        help="do not import target modules: show what waits for an import as pending")
    status.set_defaults(run=_status)
    explain = commands.add_parser("explain", help="one patch in full, and its state here")
    explain.add_argument("id")
    explain.set_defaults(run=_explain)
    launch = commands.add_parser("run", help="run a command with every Python process it starts autoloading patches",
                                 usage="patchkit run -- COMMAND [ARGS...]")
    launch.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    launch.set_defaults(run=_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        status = int(args.run(args))
    except PatchkitError as exc:
        sys.stderr.write(f"patchkit: {exc}\n")
        return 2
    exit_process = getattr(args, "exit_process", None)
    if argv is None and exit_process is not None:  # the process's own command line, not a caller's
        exit_process(status)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
