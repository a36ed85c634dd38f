"""`patchkit matrix record`: the matrix is written from what an environment ran, not typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchkit import Add, Patch, Replace, Variant, Wrap
from patchkit.matrix.record import record
from patchkit.matrix.schema import parse
from patchkit.matrix.writer import BEGIN, END, replace_patches
from patchkit.runtime.catalogue import Registered
from patchkit.runtime.errors import ConfigError
from patchkit.runtime.fingerprint import source_fingerprint

from .conftest import SOURCE, Dist

MATRIX = """# The header comment, kept as written.
schema: 1

environments:
  # --- a marker comment owned by someone else ---
  old:
    description: "the old upstream"
    install: [[torch==2.13.0], [up==1.2.3]]
    tests: [tests/up]
    ci: true

  new:
    install: []
    tests: [tests/up]
"""


def _registry(dist: Dist) -> list[Registered]:
    patch = Patch(
        id="up.feature", summary="s", why="w", upstream="u", removal="r",
        variants=(
            Variant({dist.name: "<2"}, (Replace(dist.target("Model.forward"), "x:y"),
                                        Wrap(dist.target("compute"), "x:y"),
                                        Add(dist.target("Model.extra"), "x:y")), label="old"),
            Variant({dist.name: ">=2"}, native="upstream has it", label="new"),
        ),
    )
    other = Patch(id="up.unrelated", summary="s", why="w", upstream="u", removal="r",
                  variants=(Variant({"not-installed-dist": ">=1"}, native="n"),))
    return [Registered(patch, None), Registered(other, None)]


def _record(text: str, dist: Dist, env: str) -> str:
    return replace_patches(text, record(parse(text), _registry(dist), env).patches)


def test_record_writes_versions_fingerprints_and_signatures_of_the_selected_variant(make_dist) -> None:
    dist = make_dist("1.2.3")
    written = _record(MATRIX, dist, "old")
    (entry,) = parse(written).records("up.feature", "old")
    assert entry.versions == {dist.name: "1.2.3"} and entry.status == "verified"
    assert entry.verified_by == ("tests:old",)
    assert set(entry.targets) == {dist.target("Model.forward"), dist.target("compute")}
    assert entry.targets[dist.target("Model.forward")].fingerprint == source_fingerprint(SOURCE, ["Model", "forward"])
    assert entry.targets[dist.target("compute")].signature == "(x, scale=10)"
    assert "up.unrelated" not in parse(written).patches


def test_record_keeps_everything_outside_the_generated_region(make_dist) -> None:
    written = _record(MATRIX, make_dist("1.2.3"), "old")
    assert written.startswith(MATRIX)
    assert written[len(MATRIX):].lstrip("\n").startswith(BEGIN) and written.rstrip().endswith(END)


def test_recording_again_changes_nothing_and_records_are_sorted(make_dist) -> None:
    old = make_dist("1.2.3")
    once = _record(MATRIX, old, "old")
    assert _record(once, old, "old") == once
    new = make_dist("2.1.0", like=old)
    both = _record(once, new, "new")
    assert parse(both).records("up.feature", "new")[0].status == "native"
    older = make_dist("1.10.0", like=old)
    three = _record(both, older, "old")
    versions = [r.versions[old.name] for r in parse(three).records("up.feature", "old")]
    assert versions == ["1.2.3", "1.10.0"]  # by version, not as text


def test_a_second_environment_with_the_same_versions_is_merged_into_one_record(make_dist) -> None:
    dist = make_dist("1.2.3")
    text = _record(_record(MATRIX, dist, "old"), dist, "new")
    (entry,) = parse(text).records("up.feature", "old")
    assert entry.verified_by == ("tests:new", "tests:old")


def test_recording_for_an_unknown_environment_is_refused(make_dist) -> None:
    with pytest.raises(ConfigError, match="not an environment in the matrix.*old, new"):
        _record(MATRIX, make_dist(), "olde")


def test_a_variant_over_two_distributions_records_the_combination(make_dist) -> None:
    first, second = make_dist("1.2.3"), make_dist("0.4.0")
    patch = Patch(id="up.pair", summary="s", why="w", upstream="u", removal="r",
                  variants=(Variant({first.name: "<2", second.name: ">=0.4"},
                                    (Replace(first.target("compute"), "x:y"),), label="pair"),))
    matrix = record(parse(MATRIX), [Registered(patch, None)], "old")
    (entry,) = matrix.records("up.pair", "pair")
    assert entry.versions == {first.name: "1.2.3", second.name: "0.4.0"}
    written = replace_patches(MATRIX, matrix.patches)
    assert f'versions: {{{first.name}: "1.2.3", {second.name}: "0.4.0"}}' in written


def test_the_runtime_index_is_in_step_with_the_shipped_matrix() -> None:
    from patchkit.matrix import index, load

    shipped = load(Path(__file__).resolve().parents[2] / "compat_matrix.yaml")
    assert index.PATH.read_text(encoding="utf-8") == index.render(shipped), "run `patchkit matrix index`"
    from patchkit.runtime import _recorded, fingerprint

    assert _recorded.FORMAT == fingerprint.FORMAT


def test_drift_and_code_identity_at_run_time_import_no_tooling_and_no_yaml() -> None:
    import subprocess
    import sys

    code = (
        "import sys, patchkit\n"
        "from patchkit.runtime import drift\n"
        "from patchkit.runtime.declaration import Variant, Replace\n"
        # a real record's variant name, with a target no upstream has: nothing upstream gets imported
        "v = Variant({'megatron-core': '>=0.14,<0.20'}, (Replace('patchkit_absent_module:"
        "RouterReplay.get_replay_topk', len),), label='megatron-core>=0.14,<0.20')\n"
        "drift.check('megatron.router_replay_validation', v)\n"
        "drift.identity_blocker('megatron.router_replay_validation', v)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('patchkit.matrix', 'yaml', 'packaging', 'wrapt', "
        "'importlib.metadata', 'email')))\n"
        "assert not bad, bad\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
