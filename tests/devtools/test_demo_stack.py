"""The main job (`nox -s demo`) runs a stack the compatibility matrix verified, Megatron-Bridge included,
with the opt-in patches it demonstrates switched on by their ids."""

from __future__ import annotations

import ast
from pathlib import Path

from patchkit.matrix import load
from patchkit.runtime.catalogue import scan as load_catalogue

ROOT = Path(__file__).resolve().parents[2]


def _noxfile_constant(name: str) -> object:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py defines no {name}")


def _pins() -> dict[str, str]:
    steps = _noxfile_constant("DEMO_INSTALL")
    assert isinstance(steps, list)
    return {dist.replace("_", "-").lower(): version for step in steps for requirement in step
            if "==" in requirement for dist, version in [requirement.split("==")]}


def test_the_demo_installs_megatron_core_modelopt_and_bridge_at_verified_releases() -> None:
    pins = _pins()
    assert {"megatron-core", "nvidia-modelopt", "megatron-bridge"} <= set(pins)
    matrix = load(ROOT / "compat_matrix.yaml")
    recorded = {(dist, version) for variants in matrix.patches.values() for records in variants.values()
                for record in records if record.status in ("verified", "native")
                for dist, version in record.versions.items()}
    for dist in ("megatron-core", "nvidia-modelopt", "megatron-bridge", "torch-memory-saver"):
        assert (dist, pins[dist]) in recorded, f"the demo's {dist} {pins[dist]} is not a verified release"


def test_the_demo_switches_on_opt_in_patches_by_their_ids() -> None:
    opt_ins = _noxfile_constant("DEMO_OPT_INS")
    patches, errors = load_catalogue()
    assert errors == []
    opt_in_ids = {r.patch.id for r in patches if r.patch.opt_in}
    assert set(opt_ins) == {"megatron.mtp_postprocess", "modelopt.nvfp4_cpu_fake_quant"}
    assert set(opt_ins) <= opt_in_ids
