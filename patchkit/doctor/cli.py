"""``patchkit doctor``: the command line of :mod:`.runner`, and its report in text, JSON or Markdown."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from .. import output_format
from ..report import WIDTH, lines_within, markdown_cell
from ..upstream_output import real_stderr
from . import environment
from . import runner as doctor

_SYMBOLS = {doctor.VERIFIED: "ok", doctor.FAILED: "FAIL", doctor.BLOCKED: "BLCK", doctor.NOT_APPLICABLE: "--",
            doctor.NEEDS_GPU: "gpu"}

#: Exit statuses, as docs/cli.md lists them.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "doctor", parents=[common], help="run every applied or native patch's self-check on this stack",
        description="Apply what applies here (opt-in patches included), import the upstreams, run each "
                    "selected patch's self-check and report a verdict per patch. Exit status: 0 all well, "
                    "1 a check failed or an upstream does not import, 2 bad input or a configuration error.")
    output_format.add_options(parser, json_help="machine-readable report on stdout (as --format json)")
    parser.add_argument("--patch", action="append", default=[], metavar="GLOB",
                        help="only the patches matching this id or glob (repeatable)")
    parser.add_argument("--device", default="auto",
                        help="auto (CUDA when torch sees a GPU), cpu or cuda (exit 2 where CUDA is unavailable)")
    parser.add_argument("--timeout", type=float, default=doctor.DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"time limit of one self-check (default {doctor.DEFAULT_TIMEOUT:g})")
    parser.add_argument("--upstream-output", action="store_true",
                        help="after the report, show what upstreams printed during import and each check "
                             "(also shown with --verbose)")
    parser.add_argument("--record", metavar="FILE",
                        help="write what was verified as compat-matrix records (merge with `patchkit matrix merge`)")
    parser.set_defaults(run=main, exit_process=exit_process)


def _table(verdicts: list[doctor.Verdict], facts: dict[str, Any], full: bool) -> str:
    width = max((len(v.id) for v in verdicts), default=10)
    lines = environment.header(facts["stack"], "doctor")
    for problem in facts["environment"]:
        lines += environment.describe(problem)
    for v in verdicts:
        lines += lines_within(f"{_SYMBOLS[v.verdict]:<4} {v.id:<{width}}  {v.verdict:<14} {v.seconds:6.1f} s",
                              v.message, WIDTH, full)
    counts = {name: sum(v.verdict == name for v in verdicts) for name in _SYMBOLS}
    summary = f"doctor: {', '.join(f'{n} {k}' for k, n in counts.items() if n or k != doctor.BLOCKED)}"
    done = f"{summary} on {facts['device']} in {facts['total_seconds']:.1f} s"
    timing = f" (import and apply {facts['import_and_apply_seconds']:.1f} s)"
    lines.append(done + timing if len(done + timing) <= WIDTH else done)  # one line, the last
    return "\n".join(lines)


def _markdown(verdicts: list[doctor.Verdict], facts: dict[str, Any]) -> str:
    out = ["### patchkit doctor", ""] + [f"    {line}" for line in environment.header(facts["stack"], "doctor")]
    for problem in facts["environment"]:
        out += [f"    {line}" for line in environment.describe(problem)]
    out += ["", f"Device: {facts['device']}", "", "| patch | verdict | seconds | message |", "|---|---|---|---|"]
    out += [f"| `{v.id}` | {v.verdict} | {v.seconds:.1f} | {markdown_cell(v.message)} |" for v in verdicts]
    return "\n".join(out)


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
    from ..runtime.errors import ConfigError

    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise ConfigError("--timeout", str(args.timeout), "a positive number of seconds")
    chosen = output_format.chosen(args)
    if args.record:
        from .record import check_writable

        check_writable(args.record)  # bad input: exit 2 now, not after every check has run
    if args.device != "auto":
        doctor.resolve_device(args.device)  # --device cuda without CUDA: exit 2 now, in one line
    verbose = bool(getattr(args, "verbose", False))
    report = real_stderr()
    try:
        progress = report if (report.isatty() or verbose) else None
        verdicts, facts = doctor.run(args.patch, args.device, args.timeout, progress, quiet=report)
    finally:
        report.close()
    # The record first: a reader that closes stdout early (`| head -1`) must not cost it.
    if args.record:
        from .record import write_records

        written = write_records(args.record, verdicts)
        sys.stderr.write(f"doctor: {written} record(s) written to {args.record}\n")
    upstream = _upstream_output(verdicts, facts, args.upstream_output or verbose)
    if chosen == "json":
        facts = {**facts, "upstream_output_lines": len(facts.pop("upstream_output").splitlines())}
        sys.stdout.write(json.dumps({**facts, "patches": [v.to_dict() for v in verdicts]}, indent=1) + "\n")
        sys.stderr.write(upstream)
    elif chosen == "markdown":
        sys.stdout.write(_markdown(verdicts, facts) + "\n")
        sys.stderr.write(upstream)
    else:
        sys.stdout.write(_table(verdicts, facts, verbose) + "\n" + upstream)
    sys.stdout.flush()
    # On the process's own command line, patchkit's entry point then ends the process through
    # exit_process, without waiting for a timed-out check still running in its thread.
    return doctor.exit_status(verdicts)


def exit_process(status: int) -> None:
    """End the process now: exit handlers run and output is flushed, interpreter teardown is skipped.

    Called by ``patchkit``'s entry point after the doctor's report, so a timed-out check still
    running in its daemon thread is not waited for either. With torch, megatron-core and ModelOpt
    loaded, tearing the interpreter down took 2.5 s of the doctor's wall time on the project's
    2-core machine (0.07 s this way); nothing the doctor wrote is pending by then (the record file
    is closed, the fingerprint cache flushed). A reader that closed stdout makes the status 141,
    as for a process ended by SIGPIPE, without a traceback.
    """
    import atexit
    import logging

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is not None:
        run_exit_handlers()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            status = 141
        except (OSError, ValueError):  # a closed stream: nothing more can reach it
            pass
    os._exit(status)
