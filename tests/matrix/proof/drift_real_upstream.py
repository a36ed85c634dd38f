"""Drift on a real installed upstream: a modified copy of its package on ``sys.path``.

    python tests/matrix/proof/drift_real_upstream.py PATCH_ID

Run in an environment where PATCH_ID's upstream is installed and compat_matrix.yaml holds
fingerprints for the variant it selects (from `patchkit matrix record` or `matrix static --record`).
The top-level package of the variant's first Replace/Wrap target is copied to a temp folder, and
four fresh interpreters apply the patch:

    unchanged                       -> applied, not drifted
    target body changed             -> applied, reason drifted (default mode)
    target body changed, strict     -> DriftError, nothing installed
    docstring and comment changed   -> applied, not drifted (strict)

Prints one line per case; exits 1 if any case differs from what is expected. Needs no network;
imports the real upstream, so it runs where that upstream's tests run.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import json, sys
import patchkit
from patchkit.runtime.errors import DriftError
try:
    (status,) = patchkit.apply(sys.argv[1], import_targets=True, strict=sys.argv[2] == "strict")
    print(json.dumps({"state": status.state.value, "reason": status.reason and status.reason.value,
                      "detail": status.detail}))
except DriftError as exc:
    print(json.dumps({"error": "DriftError", "detail": str(exc)}))
"""


def _target(patch_id: str) -> tuple[str, list[str]]:
    import patchkit
    from patchkit.runtime.declaration import Replace, Target, Wrap
    from patchkit.runtime.versions import installed_version, select_variant

    patch = patchkit.engine().patch(patch_id)
    found = {d: installed_version(d, patch.version_modules.get(d)) for d in patch.distributions}
    variant = select_variant(patch, found).variant
    if variant is None:
        raise SystemExit(f"{patch_id}: no variant selected by the installed upstreams")
    action = next(a for a in variant.installs if isinstance(a, (Replace, Wrap)))
    target = Target.parse(action.target)
    return target.module, list(target.path)


def _edit(path: Path, qualname: list[str], docstring_only: bool) -> None:
    from patchkit.runtime.fingerprint import locate

    source = path.read_text()
    node = locate(ast.parse(source), qualname)
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), f"{qualname} is not a def in {path}"
    lines = source.splitlines(keepends=True)
    first = node.body[0]
    indent = " " * first.col_offset
    has_doc = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
               and isinstance(first.value.value, str))
    if docstring_only:
        new = f'{indent}"""Re-documented by a fork."""  # and a comment\n'
        start = first.lineno - 1
        lines[start:first.end_lineno if has_doc else start] = [new]
    else:
        at = first.end_lineno if has_doc else first.lineno - 1
        lines.insert(at, f"{indent}_patchkit_drift_probe = None  # upstream changed the body\n")
    path.write_text("".join(lines))


def main(argv: list[str]) -> int:
    patch_id = argv[0]
    module, qualname = _target(patch_id)
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"{module} is not installed"
    spec_file = spec.origin
    top = module.partition(".")[0]
    package_root = Path(spec_file).parents[len(module.split(".")) - (0 if spec_file.endswith("__init__.py") else 1)]
    cases = [("unchanged", None, "default", {"state": "applied", "reason": None}),
             ("body changed", "body", "default", {"state": "applied", "reason": "drifted"}),
             ("body changed, strict", "body", "strict", {"error": "DriftError"}),
             ("docstring changed, strict", "doc", "strict", {"state": "applied", "reason": None})]
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        for name, edit, mode, expected in cases:
            env = dict(os.environ)
            if edit is not None:
                copy = Path(scratch) / edit
                if not copy.exists():
                    shutil.copytree(package_root / top, copy / top)
                    _edit(copy / Path(spec_file).relative_to(package_root), qualname, edit == "doc")
                env["PYTHONPATH"] = os.pathsep.join([str(copy), env.get("PYTHONPATH", "")])
            result = subprocess.run([sys.executable, "-c", PROBE, patch_id, mode], capture_output=True, text=True,
                                    env=env)
            lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
            got = json.loads(lines[-1]) if lines else {"error": result.stderr[-300:]}
            ok = all(got.get(k) == v for k, v in expected.items())
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {got}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
