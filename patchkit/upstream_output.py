"""Keeping what upstreams print out of the doctor's report, without losing patchkit's own messages.

Importing megatron-core, ModelOpt or torch, and building their tiny models in the self-checks,
prints dozens of lines: ``warnings.warn`` at import, ``GPTModel IS DEPRECATED`` through logging's
last-resort handler, torch's own stream handlers, C++ output. :func:`captured` points file
descriptors 1 and 2 at a temporary file for the length of a block, so all of it (Python or C) lands
there, and hands back the text. What patchkit itself says in the block still reaches the user:
``PatchkitWarning`` (a config error that disables patches) is shown again after the block, once, and
the ``patchkit`` logger's records go to the report stream for the length of the block.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO


@dataclass
class Captured:
    """What upstream code wrote to stdout/stderr during one block."""

    text: str = ""

    @property
    def lines(self) -> int:
        return len(self.text.splitlines())


def real_stderr() -> IO[str]:
    """A stream on a duplicate of file descriptor 2, unaffected by :func:`captured` (caller closes it)."""
    return os.fdopen(os.dup(2), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                     errors="replace")


@contextlib.contextmanager
def captured(report: IO[str]) -> Iterator[Captured]:
    """Send fds 1 and 2 to a temporary file for the block; patchkit's own messages go to ``report``."""
    from .runtime.errors import PatchkitWarning

    result = Captured()
    own_logger = logging.getLogger("patchkit")
    # patchkit's records go to the report for the block, whatever handlers the process has.
    handler = logging.StreamHandler(report)
    handler.setFormatter(logging.Formatter("%(message)s"))
    propagated = own_logger.propagate
    own_logger.addHandler(handler)
    own_logger.propagate = False
    streams = (sys.stdout, sys.stderr)
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings(record=True) as caught:
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        # Python-level writes too, when sys.stdout/sys.stderr are not the descriptors (a notebook, pytest).
        text_sink = open(sink.fileno(), "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        try:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            sys.stdout = sys.stderr = text_sink
            yield result
        finally:
            text_sink.flush()
            sys.stdout, sys.stderr = streams
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            text_sink.close()
            own_logger.removeHandler(handler)
            own_logger.propagate = propagated
            sink.seek(0)
            printed = sink.read().decode("utf-8", errors="replace")
            upstream: list[str] = []
            reported: set[str] = set()
            for warning in caught:
                shown = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno,
                                               warning.line)
                if issubclass(warning.category, PatchkitWarning):
                    if str(warning.message) not in reported:  # the same config error, met by each apply
                        reported.add(str(warning.message))
                        report.write(shown)
                else:
                    upstream.append(shown)
            result.text = "".join(upstream) + printed
