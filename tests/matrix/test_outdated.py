"""`patchkit matrix outdated`: newer releases than the matrix records, assessed from their sources.

The index and the artifacts are replaced by toy release trees written here (the download path is
the one `matrix static` proves); the assessment is the real code.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from patchkit import Patch, Replace, Variant
from patchkit.matrix.artifacts import SourceTree
from patchkit.matrix.outdated import ATTENTION, CODE_IDENTICAL, OK, outdated, render
from patchkit.matrix.schema import parse
from patchkit.runtime.catalogue import Registered
from patchkit.runtime.fingerprint import source_fingerprint

OLD = "def forward(x):\n    return x + 1\n"
REFORMATTED = '''def forward(x):
    """Docstrings and formatting are not code."""
    return (x
            + 1)
'''
CHANGED = "def forward(x):\n    return x + 2\n"


def tree(tmp_path: Path, version: str, source: str | None) -> SourceTree:
    root = tmp_path / version
    (root / "up").mkdir(parents=True)
    (root / "up" / "__init__.py").write_text("")
    if source is not None:
        (root / "up" / "core.py").write_text(textwrap.dedent(source))
    return SourceTree("up", version, root, f"up-{version}.tar.gz")


def patch(native_from: str | None = None) -> Registered:
    variants = [Variant(requires={"up": ">=1.0,<2.0"}, installs=(Replace("up.core:forward", "x:y"),), label="v1")]
    if native_from:
        variants.append(Variant(requires={"up": f">={native_from}"}, native="upstream fixed it", label="native"))
    return Registered(Patch("up.forward", "s", "w", "u", "r", tuple(variants)), None)


def matrix_with(fingerprint: str):
    return parse(f"""schema: 1
environments:
  e: {{install: [], tests: [t]}}
patches:
  up.forward:
    v1:
      - versions: {{up: '1.0'}}
        status: verified
        targets:
          'up.core:forward': {{fingerprint: "{fingerprint}"}}
""", "m.yaml")


def run(tmp_path, registered, sources: dict[str, str | None]):
    matrix = matrix_with(source_fingerprint(OLD, ["forward"]))
    return outdated(matrix, [registered], ["up"], releases=lambda dist: ["0.9", "1.0", *sources],
                    tree_of=lambda dist, version: tree(tmp_path, version, sources[version]))


def test_only_releases_newer_than_the_matrix_records_are_assessed_with_pre_releases_flagged(tmp_path):
    found = run(tmp_path, patch(), {"1.1": REFORMATTED, "2.0rc1": OLD})
    assert [(a.version, a.prerelease, a.verdict) for a in found] == [
        ("1.1", False, OK), ("2.0rc1", True, CODE_IDENTICAL)]
    assert "2.0rc1 (pre-release) up.forward" in render(found, {"up": None})


def test_changed_or_missing_code_needs_attention_and_names_the_target(tmp_path):
    found = run(tmp_path, patch(), {"1.2": CHANGED, "2.1": None})
    assert [a.verdict for a in found] == [ATTENTION, ATTENTION]
    assert "up.core:forward changed" in found[0].detail
    assert "past every range of variant v1: up.core:forward is absent" in found[1].detail


def test_a_release_in_a_native_range_needs_nothing(tmp_path):
    found = run(tmp_path, patch(native_from="3.0"), {"3.0": CHANGED})
    assert [(a.verdict, a.detail) for a in found] == [(OK, "native in this range")]
