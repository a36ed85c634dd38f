"""``patchkit doctor [--json] [--patch GLOB] [--device auto|cpu|cuda] [--timeout S] [--record FILE]``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from ..upstream_output import real_stderr
from . import runner as doctor

_SYMBOLS = {doctor.VERIFIED: "ok", doctor.FAILED: "FAIL", doctor.NOT_APPLICABLE: "--", doctor.NEEDS_GPU: "gpu"}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("doctor", help="run every applied or native patch's self-check on this stack")
    parser.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    parser.add_argument("--patch", action="append", default=[], metavar="GLOB",
                        help="only the patches matching this id or glob (repeatable)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when torch sees a GPU), cpu or cuda")
    parser.add_argument("--timeout", type=float, default=doctor.DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"time limit of one self-check (default {doctor.DEFAULT_TIMEOUT:g})")
    parser.add_argument("--verbose", "-v", "--upstream-output", action="store_true", dest="upstream_output",
                        help="after the report, show what upstreams printed during import and each check")
    parser.add_argument("--record", metavar="FILE",
                        help="write what was verified as compat-matrix records (merge with `patchkit matrix merge`)")
    parser.set_defaults(run=main, exit_process=exit_process)


def _table(verdicts: list[doctor.Verdict], facts: dict[str, Any]) -> str:
    width = max((len(v.id) for v in verdicts), default=10)
    lines = [f"{_SYMBOLS[v.verdict]:<4} {v.id:<{width}}  {v.verdict:<14} {v.seconds:6.1f} s  {v.message}"
             for v in verdicts]
    counts = {name: sum(v.verdict == name for v in verdicts) for name in _SYMBOLS}
    lines.append(f"doctor: {', '.join(f'{n} {k}' for k, n in counts.items())} on {facts['device']} "
                 f"(import and apply {facts['import_and_apply_seconds']:.1f} s, total {facts['total_seconds']:.1f} s)")
    return "\n".join(lines)


def _upstream_output(verdicts: list[doctor.Verdict], facts: dict[str, Any], verbose: bool) -> str:
    """One line counting what upstreams printed; with ``verbose``, the text itself, per phase."""
    phases = [("import and apply", facts["upstream_output"])] + [(v.id, v.upstream_output) for v in verdicts]
    total = sum(len(text.splitlines()) for _, text in phases)
    if not total:
        return ""
    if not verbose:
        return f"doctor: upstreams printed {total} line(s) during import and the checks (--verbose shows them)\n"
    shown = [f"--- upstream output during {name} ({len(text.splitlines())} lines) ---\n{text.rstrip()}\n"
             for name, text in phases if text]
    return "".join(shown)


def main(args: argparse.Namespace) -> int:
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        from ..runtime.errors import ConfigError

        raise ConfigError("--timeout", str(args.timeout), "a positive number of seconds")
    if args.record:
        from .record import check_writable

        check_writable(args.record)  # bad input: exit 2 now, not after every check has run
    report = real_stderr()
    try:
        progress = report if report.isatty() and not args.json else None
        verdicts, facts = doctor.run(args.patch, args.device, args.timeout, progress, quiet=report)
    finally:
        report.close()
    upstream = _upstream_output(verdicts, facts, args.upstream_output)
    if args.json:
        facts = {**facts, "upstream_output_lines": len(facts.pop("upstream_output").splitlines())}
        sys.stdout.write(json.dumps({**facts, "patches": [v.to_dict() for v in verdicts]}, indent=1) + "\n")
        sys.stderr.write(upstream)
    else:
        sys.stdout.write(_table(verdicts, facts) + "\n" + upstream)
    if args.record:
        from .record import write_records

        written = write_records(args.record, verdicts)
        sys.stderr.write(f"doctor: {written} record(s) written to {args.record}\n")
    # On the process's own command line, patchkit's entry point then ends the process through
    # exit_process, without waiting for a timed-out check still running in its thread.
    return doctor.exit_status(verdicts)


def exit_process(status: int) -> None:
    """End the process now: exit handlers run and output is flushed, interpreter teardown is skipped.

    Called by ``patchkit``'s entry point after the doctor's report, so a timed-out check still
    running in its daemon thread is not waited for either. With torch, megatron-core and ModelOpt
    loaded, tearing the interpreter down took 2.5 s of the doctor's wall time on the project's
    2-core machine (0.07 s this way); nothing the doctor wrote is pending by then (the record file
    is closed, the fingerprint cache flushed).
    """
    import atexit
    import logging

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is not None:
        run_exit_handlers()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
