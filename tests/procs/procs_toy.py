"""For process tests: a real toy distribution whose patch autoload can apply.

The catalogue's patches target Megatron, ModelOpt and vLLM, none of which this environment has, so
the processes here apply a patch of ``pkproc-toy``: a distribution written once per session to a
temp folder (a package and a ``.dist-info`` that ``importlib.metadata`` reads) and put on
``PYTHONPATH``, so every interpreter the tests start, and every process those start, can import it
from the first line. Its declaration modules reach autoload through ``PATCHKIT_EXTRA_PATCHES``.
No part of patchkit is replaced: the processes autoload through the installed ``.pth`` hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from patchkit.processes.autoload import ACTIVE_MARKER
from patchkit.runtime import settings


def _toy_declaration(patch_id: str, summary: str, why: str, install: str, prelude: str = "") -> str:
    """A declaration module of one ``pkproc-toy`` patch installing ``install`` (``Replace(...)``, ``Wrap(...)``),
    after ``prelude`` (one line)."""
    return f"""
        {prelude}
        from patchkit import Patch, Replace, Variant, Wrap

        PATCHES = (
            Patch(
                id="{patch_id}", summary="{summary}", why="{why}",
                upstream="tests/procs/conftest.py", removal="never",
                variants=(Variant(requires={{"pkproc-toy": ">=1"}}, installs=({install},)),),
            ),
        )
    """


TOY_FILES = {
    "pkproc_toy/__init__.py": '__version__ = "1.0.0"\n',
    "pkproc_toy/core.py": """
        class Model:
            def forward(self, x):
                return x + 1
    """,
    "pkproc_toy/_impl.py": """
        def forward(self, x):
            return x + 1000


        def broken(original):
            raise RuntimeError("toy patch exploded at start-up")
    """,
    # The patch every test process should have: Model.forward(1) is 1001 with it, 2 without.
    "pkproc_toy/patches.py": _toy_declaration(
        "toy.forward", "adds 1000", "a patch processes can be compared on",
        'Replace("pkproc_toy.core:Model.forward", "._impl:forward")'),
    # A patch that fails at interpreter start: its target is imported by the declaration itself.
    "pkproc_toy/failing.py": _toy_declaration(
        "toy.broken", "always fails", "start-up must survive it",
        'Wrap("pkproc_toy.core:Model.forward", "._impl:broken")',
        prelude="import pkproc_toy.core  # so the patch installs, and fails, during autoload"),
    # A declaration module that starts a Python process while it is imported, i.e. during autoload.
    # Without the recursion guard that child would autoload, import this module, start another...
    # PKPROC_DEPTH bounds the damage should the guard ever break.
    "pkproc_toy/spawning.py": """
        import json, os, subprocess, sys

        depth = int(os.environ.get("PKPROC_DEPTH", "0"))
        if depth > 2:
            raise RuntimeError("autoload recursed: a process spawned during autoload autoloaded again")
        CHILD = subprocess.run(
            [sys.executable, "-c",
             "import json, sys, patchkit.processes.autoload as a; o = a.outcome(); "
             "sys.stdout.write(json.dumps(o.to_dict() if o else None))"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PKPROC_DEPTH": str(depth + 1)},
        )
        CHILD_OUTCOME = json.loads(CHILD.stdout) if CHILD.returncode == 0 else {"stderr": CHILD.stderr}
        PATCHES = ()
    """,
    # A second declaration of toy.forward: a clash autoload must report, keeping the first.
    "pkproc_toy/clash.py": """
        from pkproc_toy.patches import PATCHES as FIRST

        PATCHES = (FIRST[0]._replace(summary="a different toy.forward"),)
    """,
    # A declaration module with a module-level argparse: SystemExit(2) while autoload imports it.
    "pkproc_toy/exiting.py": """
        import argparse

        argparse.ArgumentParser(prog="exiting").parse_args(["--not-an-option"])
        PATCHES = ()
    """,
    # An extra-patches package whose __init__ calls autoload.load() itself, while autoload imports it.
    "pkproc_reentrant/__init__.py": """
        import patchkit.processes.autoload as autoload

        INNER_OUTCOME = autoload.load()
    """,
    "pkproc_reentrant/patches.py": _toy_declaration(
        "toy.forward", "adds 1000", "the toy patch, declared from a re-entrant package",
        'Replace("pkproc_toy.core:Model.forward", "pkproc_toy._impl:forward")'),
    "pkproc_toy-1.0.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: pkproc-toy\nVersion: 1.0.0\n",
}

#: Prints the process's manifest and what the patched method returns, as one JSON line.
REPORT = textwrap.dedent("""
    import json, sys
    from pkproc_toy.core import Model
    from patchkit.processes import manifest
    sys.stdout.write(json.dumps({"forward": Model().forward(1), "manifest": manifest.collect().to_dict()}))
""")


@dataclass(frozen=True)
class Toy:
    site: Path

    def env(self, base: Mapping[str, str] | None = None, **variables: str) -> dict[str, str]:
        """A clean environment: no inherited PATCHKIT_* variables, the toy on PYTHONPATH."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in settings.VARIABLES and k != ACTIVE_MARKER}
        env["PYTHONPATH"] = os.pathsep.join([str(self.site), *filter(None, [env.get("PYTHONPATH")])])
        env.update(variables)
        return env

    def python(self, code: str, timeout: float = 120, **variables: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              env=self.env(**variables), cwd=self.site)

    def report(self, **variables: str) -> dict:
        result = self.python(REPORT, **variables)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


#: The toggles autoload needs to find the toy's patch.
TOY_PATCHES = {"PATCHKIT_EXTRA_PATCHES": "pkproc_toy.patches"}
AUTOLOAD = {"PATCHKIT_AUTOLOAD": "1", **TOY_PATCHES}


def toy_entry(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    """The toy patch's entry in a manifest dict; the catalogue's own patches sit beside it."""
    (entry,) = [e for e in manifest["patches"] if e["id"] == "toy.forward"]
    return entry
