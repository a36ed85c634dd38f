"""A script run in a new interpreter, as a host starts its processes (no test harness, patchkit as
installed): the JSON the script prints last is what a test reads there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any


def last_printed(script: str, *, without: tuple[str, ...], timeout: float, options: Sequence[str] = (),
                 check: bool = False, **env: str) -> Any:
    """Run ``script`` in a new interpreter (``python [options] -c script``) whose environment is this one's,
    less every variable whose name starts with one of ``without``, plus ``env``. Returns the JSON it
    printed last. If it exited non-zero: with ``check``, the test fails showing its ``stderr``; without,
    its exit code (``returncode``) and the end of its ``stderr`` are returned instead."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(without)}
    environ.update(env)
    done = subprocess.run([sys.executable, *options, "-c", script], env=environ, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        assert not check, done.stderr[-3000:]
        return {"returncode": done.returncode, "stderr": done.stderr[-3000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])
