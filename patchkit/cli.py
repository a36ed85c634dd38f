"""The ``patchkit`` command: list, status, explain, doctor, run, matrix."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from typing import Sequence

from . import engine as default_engine
from .doctor.cli import add_parser as add_doctor_parser
from .matrix.cli import add_parser as add_matrix_parser
from .report import describe, status_json, status_table
from .runtime.errors import PatchkitError


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")


def _list(args: argparse.Namespace) -> int:
    eng = default_engine()
    for patch_id in eng.ids():
        _write(describe(eng.patch(patch_id)))
    return 0


def _status(args: argparse.Namespace) -> int:
    eng = default_engine()
    # Upstreams print while being imported (vLLM's logger writes to stdout): keep stdout for our
    # report, so `status --json` stays parseable.
    with contextlib.redirect_stdout(sys.stderr):
        eng.apply_all()
        records = eng.status() if args.no_import else eng.import_targets()
    _write(status_json(records) if args.json else status_table(records))
    return 1 if any(r.state.value == "failed" for r in records) else 0


def _explain(args: argparse.Namespace) -> int:
    eng = default_engine()
    _write(describe(eng.patch(args.id), verbose=True))
    eng.apply_all()
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
        return int(args.run(args))
    except PatchkitError as exc:
        sys.stderr.write(f"patchkit: {exc}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
