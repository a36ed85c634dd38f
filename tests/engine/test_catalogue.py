"""How the catalogue tells declaration modules from public helper modules, without importing them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from patchkit.runtime import catalogue

_DECLARATION = """
from patchkit import Patch, Variant
PATCHES{annotation} = (
    Patch(id={id!r}, summary="s", why="w", upstream="u", removal="r",
          variants=(Variant(requires={{"d": ">=1"}}, native="n"),)),
)
"""


@pytest.fixture
def toy_catalogue(tmp_path, monkeypatch):
    """A catalogue package ``pk_toy_cat`` with one upstream folder of mixed modules."""
    name = f"pk_toy_cat_{tmp_path.name.replace('-', '_')}"
    upstream = tmp_path / name / "up"
    upstream.mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text("")
    (upstream / "__init__.py").write_text("")
    (upstream / "plain.py").write_text(_DECLARATION.format(annotation="", id="toy.plain"))
    (upstream / "annotated.py").write_text(_DECLARATION.format(annotation=": tuple", id="toy.annotated"))
    # A helper API module: no PATCHES, and importing it would fail, so the catalogue must not import it.
    (upstream / "helper_api.py").write_text('raise RuntimeError("a helper module was imported at start-up")\n')
    # PATCHES only inside a function, a docstring example and a comparison: still not a declaration.
    (upstream / "mentions.py").write_text(textwrap.dedent('''\
        """Example::

            PATCHES = ()
        """
        raise RuntimeError("a module that only mentions PATCHES was imported")
        def f():
            PATCHES = ()
        PATCHES == ()
        '''))
    # A declaration module that fails to import is still found, and reported.
    (upstream / "broken.py").write_text('raise ValueError("broken declaration")\nPATCHES = ()\n')
    (upstream / "_private.py").write_text('raise RuntimeError("a private module was imported")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[module]


def test_only_modules_assigning_patches_are_declaration_modules(toy_catalogue):
    found, errors = catalogue.load(toy_catalogue)
    assert sorted(r.patch.id for r in found) == ["toy.annotated", "toy.plain"]
    assert [e.module for e in errors] == [f"{toy_catalogue}.up.broken"]
    assert "broken declaration" in errors[0].error
    assert f"{toy_catalogue}.up.helper_api" not in sys.modules
    assert f"{toy_catalogue}.up.mentions" not in sys.modules


@pytest.mark.parametrize("source, expected", [
    ("PATCHES = ()\n", True),
    ("PATCHES: tuple[Patch, ...] = (\n)\n", True),
    ("PATCHES\t= ()\n", True),
    ("x = 1\nPATCHES=(P,)\n", True),
    ("    PATCHES = ()\n", False),
    ("# PATCHES = ()\n", False),
    ("PATCHES == ()\n", False),
    ("MY_PATCHES = ()\n", False),
    ("PATCHES_EXTRA = ()\n", False),
    ("from .x import PATCHES\n", False),
    ("", False),
])
def test_declares_patches_reads_top_level_assignments_only(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert catalogue.declares_patches(str(path)) is expected


def test_shipped_helper_modules_are_not_loaded_at_start_up_and_declare_nothing():
    """The public APIs carry no dummy ``PATCHES``; the modules behind a family package's API stay out
    of start-up (the package itself is imported: its declarations sit in it)."""
    helpers = ["patchkit.patches.megatron.router_replay._api", "patchkit.patches.megatron.mtp._api",
               "patchkit.patches.modelopt.qat._apply", "patchkit.patches.vllm.refit._api",
               "patchkit.patches.vllm.lora._api", "patchkit.patches.entry_points"]
    families = ["patchkit.patches.megatron.router_replay", "patchkit.patches.megatron.mtp",
                "patchkit.patches.modelopt.qat", "patchkit.patches.bridge.qat", "patchkit.patches.vllm.refit",
                "patchkit.patches.vllm.lora"]
    code = textwrap.dedent(f"""
        import importlib, sys
        from patchkit.runtime import catalogue
        found, errors = catalogue.load()
        assert not errors, errors
        helpers = {helpers!r}
        assert not [h for h in helpers if h in sys.modules], [h for h in helpers if h in sys.modules]
        public = [h for h in helpers if "._" not in h] + {families!r}
        assert not [h for h in public if hasattr(importlib.import_module(h), "PATCHES")]
        print(len(found))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 15


def test_declarations_in_a_family_sub_package_are_found_one_level_deep(toy_catalogue, tmp_path):
    family = tmp_path / toy_catalogue / "up" / "family"
    (family / "_checks").mkdir(parents=True)
    (family / "__init__.py").write_text("")
    (family / "nested.py").write_text(_DECLARATION.format(annotation="", id="toy.nested"))
    (family / "_impl.py").write_text('raise RuntimeError("an implementation module was imported")\n')
    (family / "_checks" / "__init__.py").write_text("")
    (family / "_checks" / "hidden.py").write_text(_DECLARATION.format(annotation="", id="toy.hidden"))
    deeper = family / "deeper"
    deeper.mkdir()
    (deeper / "__init__.py").write_text("")
    (deeper / "too_deep.py").write_text(_DECLARATION.format(annotation="", id="toy.too_deep"))
    found, _ = catalogue.load(toy_catalogue)
    assert sorted(r.patch.id for r in found) == ["toy.annotated", "toy.nested", "toy.plain"]
    assert {r.package for r in found if r.patch.id == "toy.nested"} == {f"{toy_catalogue}.up.family"}
