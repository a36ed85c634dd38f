"""The wheel's package list names every package of the source tree (it is written out by hand,
because patches/ ships as patchkit.patches)."""

from __future__ import annotations

import pathlib
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _packages_in(folder: pathlib.Path, dotted: str) -> set[str]:
    return {
        ".".join([dotted, *init.parent.relative_to(folder).parts])
        for init in folder.rglob("__init__.py") if "__pycache__" not in init.parts
    }


def test_every_source_package_ships_in_the_wheel():
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = _packages_in(ROOT / "patchkit", "patchkit") | _packages_in(ROOT / "patches", "patchkit.patches")
    assert in_tree - declared == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert declared - in_tree == set()
