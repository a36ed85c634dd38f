"""The catalogue's generated index: kept in step with the declarations, and what start-up reads instead of them.

A toy catalogue (a package with an upstream folder and a family sub-package, on ``sys.path``) gets
its index from the real generator; a real installed toy distribution (``make_upstream``) is what
its patches target. The shipped catalogue's own index is checked against its declarations.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fresh_process import last_printed

from patchkit import Engine, Reason, State
from patchkit.matrix import catalogue_index
from patchkit.runtime import catalogue

DECLARATION = '''
from patchkit import Patch, Variant, Wrap

PATCHES = (
    Patch(
        id={id!r}, summary="s", why="w", upstream="u", removal="r", opt_in={opt_in!r},
        version_modules={{{dist!r}: {package!r}}},
        variants={variants},
    ),
)
'''
#: The variants a toy patch gets unless a test gives its own: ``factory`` wraps ``target`` below 2, native from 2.
TWO_VARIANTS = '''(
            Variant(requires={{{dist!r}: ">=1,<2"}}, installs=(Wrap({target!r}, "._impl:{factory}"),)),
            Variant(requires={{{dist!r}: ">=2"}}, native="upstream does it from 2 on"),
        )'''
IMPL = '''
def plus_100(original):
    def forward(self, x):
        return original(self, x) + 100
    return forward


def plus_200(original):
    def forward(self, x):
        return original(self, x) + 200
    return forward
'''


class ToyCatalogue:
    """A catalogue package ``name`` with upstream folder ``up`` (and family ``up.fam``) for ``upstream``."""

    def __init__(self, root: Path, name: str, upstream) -> None:
        self.root, self.name, self.upstream = root, name, upstream
        self.folder = root / name / "up"

    def declare(self, module: str, patch_id: str, *, factory: str = "plus_100", opt_in: bool = False,
                target: str | None = None, variants: str | None = None) -> None:
        """Write declaration module ``module`` with one patch of the toy upstream: ``TWO_VARIANTS``, or
        ``variants`` (their source, a tuple of ``Variant``)."""
        path = self.folder.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != self.folder:
            (path.parent / "__init__.py").touch()
            (path.parent / "_impl.py").write_text(IMPL)
        if variants is None:
            variants = TWO_VARIANTS.format(dist=self.upstream.name, factory=factory,
                                           target=target or self.upstream.target("Model.forward"))
        path.write_text(DECLARATION.format(id=patch_id, opt_in=opt_in, dist=self.upstream.name,
                                           package=self.upstream.package, variants=variants))
        self.forget()

    def remove(self, module: str) -> None:
        self.folder.joinpath(*module.split(".")).with_suffix(".py").unlink()
        self.forget()

    def write_index(self) -> None:
        catalogue_index.write(self.name)
        self.forget()

    def forget(self) -> None:
        """Drop every module of the catalogue, so the next load reads the files as they are now."""
        for module in [m for m in sys.modules if m == self.name or m.startswith(self.name + ".")]:
            del sys.modules[module]
        importlib.invalidate_caches()

    def imported(self) -> list[str]:
        return sorted(m for m in sys.modules if m.startswith(f"{self.name}.up."))

    def engine(self) -> Engine:
        return Engine(*catalogue.load(self.name))


def ids(records) -> list[str]:
    """The patch ids of what the catalogue loaded: index records and imported declarations alike."""
    return sorted(r.id if isinstance(r, catalogue.Indexed) else r.patch.id for r in records)


@pytest.fixture
def toy_catalogue(tmp_path, make_upstream, monkeypatch):
    # Declarations are rewritten within a second at the same size: cached bytecode would hide that.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    upstream = make_upstream("1.5")
    name = f"pk_indexed_{tmp_path.name.replace('-', '_')}"
    toy = ToyCatalogue(tmp_path / "catalogue", name, upstream)
    toy.folder.mkdir(parents=True)
    (toy.folder.parent / "__init__.py").write_text("")
    (toy.folder / "__init__.py").write_text("")
    (toy.folder / "_impl.py").write_text(IMPL)
    (toy.folder / "helper_api.py").write_text('raise RuntimeError("a helper module was imported")\n')
    toy.declare("forward", "toy.forward")
    toy.declare("fam.scale", "toy.family_member", opt_in=True, target=upstream.target("Model.backward"))
    monkeypatch.syspath_prepend(str(toy.root))
    toy.write_index()
    yield toy
    toy.forget()


# -- kept in step --------------------------------------------------------------------------------


def test_the_shipped_index_matches_the_declarations():
    """Fails when a declaration was added, removed or changed without `patchkit matrix catalogue`."""
    stale = [name for name, text in catalogue_index.render().items() if catalogue_index.current()[name] != text]
    assert not stale, f"stale: {stale}; run `patchkit matrix catalogue` and commit the result"


def test_the_shipped_index_holds_every_declared_patch_and_the_same_declarations():
    scanned, errors = catalogue.scan()
    assert not errors, errors
    indexed, _ = catalogue.load()
    assert sorted(r.id for r in indexed) == sorted(r.patch.id for r in scanned)
    declared = {r.patch.id: (catalogue.normalized(r.patch), r.package) for r in scanned}
    for record in indexed:
        assert isinstance(record, catalogue.Indexed)
        made = record.registered()
        assert (made.patch, made.package) == declared[record.id]
        assert catalogue.indexed_summary(made.patch) == record[:5]


@pytest.mark.parametrize("change", ["add", "add to a family", "remove", "modify"])
def test_a_declaration_changed_since_the_index_makes_it_stale(toy_catalogue, change):
    assert not catalogue_index.is_stale(toy_catalogue.name)
    if change == "add":
        toy_catalogue.declare("newcomer", "toy.newcomer")
    elif change == "add to a family":
        toy_catalogue.declare("fam.newcomer", "toy.newcomer")
    elif change == "remove":
        toy_catalogue.remove("forward")
    else:
        toy_catalogue.declare("forward", "toy.forward", factory="plus_200")
    assert catalogue_index.is_stale(toy_catalogue.name)
    toy_catalogue.write_index()
    assert not catalogue_index.is_stale(toy_catalogue.name)


def test_the_check_command_fails_on_a_stale_index_and_the_command_rewrites_it(toy_catalogue):
    toy_catalogue.declare("newcomer", "toy.newcomer")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_catalogue.root), *sys.path])}
    check = [sys.executable, "-m", "patchkit", "matrix", "catalogue", "--package", toy_catalogue.name, "--check"]
    stale = subprocess.run(check, capture_output=True, text=True, timeout=120, env=env)
    assert stale.returncode == 1 and "is stale" in stale.stdout and "toy.newcomer" in stale.stdout
    write = subprocess.run(check[:-1], capture_output=True, text=True, timeout=120, env=env)
    assert write.returncode == 0, write.stderr
    assert subprocess.run(check, capture_output=True, text=True, timeout=120, env=env).returncode == 0


def test_the_generator_finds_declarations_in_family_sub_packages_and_skips_helpers(toy_catalogue):
    index = importlib.import_module(f"{toy_catalogue.name}._index")
    assert sorted(set(index.DECLARED_IN.values())) == ["up.fam.scale", "up.forward"]
    assert "helper_api.py" in index.FOLDERS["up"] and "fam" in index.FOLDERS["up"]
    assert f"{toy_catalogue.name}.up.helper_api" not in sys.modules


# -- what start-up reads -------------------------------------------------------------------------


def test_loading_from_the_index_imports_no_declaration_module(toy_catalogue):
    records, errors = catalogue.load(toy_catalogue.name)
    assert not errors
    assert ids(records) == ["toy.family_member", "toy.forward"]
    assert {r.declared_in for r in records} == {f"{toy_catalogue.name}.up.forward",
                                                f"{toy_catalogue.name}.up.fam.scale"}
    assert toy_catalogue.imported() == []


def test_a_declaration_module_is_imported_only_when_its_target_module_is(toy_catalogue):
    engine = toy_catalogue.engine()
    try:
        (forward,) = engine.apply_all(enable="toy.forward")[1:]
        # Its target module, and its upstream's package: importing that tells the release, where it may be native.
        assert forward.state is State.PENDING
        assert forward.waiting_for == (toy_catalogue.upstream.core, toy_catalogue.upstream.package)
        assert toy_catalogue.imported() == []
        core = toy_catalogue.upstream.import_core()
        assert engine.status("toy.forward")[0].state is State.APPLIED
        assert core.Model().forward(1) == 102
        assert toy_catalogue.imported() == [f"{toy_catalogue.name}.up._impl", f"{toy_catalogue.name}.up.forward"]
    finally:
        engine.revert_all()
    assert core.Model().forward(1) == 2


def test_applying_after_the_upstream_import_installs_at_once_and_stays_idempotent(toy_catalogue):
    core = toy_catalogue.upstream.import_core()
    engine = toy_catalogue.engine()
    try:
        for _ in range(2):
            statuses = {s.id: s for s in engine.apply_all()}
            assert statuses["toy.forward"].state is State.APPLIED
            assert statuses["toy.family_member"].reason is Reason.OPT_IN
            assert core.Model().forward(1) == 102  # wrapped once, not twice
        assert f"{toy_catalogue.name}.up.fam.scale" not in sys.modules  # opt-in: never imported
    finally:
        engine.revert_all()


def test_an_upstream_that_is_not_installed_is_skipped_without_importing_its_patches(toy_catalogue, tmp_path):
    toy_catalogue.declare("elsewhere", "toy.elsewhere")
    source = toy_catalogue.folder / "elsewhere.py"
    source.write_text(source.read_text().replace(toy_catalogue.upstream.name, "not-installed-dist")
                      .replace(toy_catalogue.upstream.package, "not_installed_pkg"))
    toy_catalogue.write_index()
    engine = toy_catalogue.engine()
    status = {s.id: s for s in engine.apply_all()}["toy.elsewhere"]
    assert (status.state, status.reason, status.detail) == (State.SKIPPED, Reason.NOT_INSTALLED,
                                                            "not-installed-dist not installed")
    assert toy_catalogue.imported() == []


def test_apply_all_reads_no_declaration_data_while_no_target_module_is_imported(toy_catalogue):
    """Waiting undecided costs the index's summary alone: the declarations' data module (and so the
    ``Patch`` of each) is read only once a patch needs its variants."""
    engine = toy_catalogue.engine()
    try:
        statuses = {s.id: s for s in engine.apply_all()}
        assert statuses["toy.forward"].state is State.PENDING
        assert f"{toy_catalogue.name}.{catalogue.DECLARATIONS_MODULE}" not in sys.modules
    finally:
        engine.revert_all()


KEPT_BY_THE_FIRST_APPLY_ALL = """
    import gc, json
    from patchkit.runtime import process_engine
    gc.disable()  # counted, not collected: the count is what sets off the garbage collector's next collection
    before = gc.get_count()[0]
    statuses = process_engine.apply_all_from_index(catalogues=[{name!r}])
    kept = gc.get_count()[0] - before
    print(json.dumps({{"kept": kept, "pending": sum(s.state.value == "pending" for s in statuses)}}))
"""


def test_a_patch_waiting_for_its_upstreams_code_keeps_few_objects_at_start_up(toy_catalogue):
    """The objects the first ``apply_all()`` keeps per waiting patch (allocated and not freed: what counts
    towards the garbage collector's next collection): its status, the index's tuple of the modules it
    waits for (which the status shares), its module's hook. A record per patch, a version map per patch,
    a tuple per index row would each add one for every patch of the catalogue. Run where the toy
    upstream is installed and not imported, so every added patch waits for a module of its own."""
    up = toy_catalogue.upstream
    script = textwrap.dedent(KEPT_BY_THE_FIRST_APPLY_ALL.format(name=toy_catalogue.name))
    env = {"PYTHONPATH": os.pathsep.join([str(toy_catalogue.root), str(up.root), *sys.path])}

    def kept() -> tuple[int, int]:
        # With bytecode written and read, as users have it.
        found = last_printed(script, without=("PATCHKIT_", "PYTHONDONTWRITEBYTECODE"), timeout=120, check=True,
                             **env)
        return found["kept"], found["pending"]

    kept(), kept()
    small, small_pending = kept()
    added = 60
    for n in range(added):
        toy_catalogue.declare(f"gen_{n:02d}", f"toy.gen_{n:02d}", target=f"{up.package}.gen_{n:02d}:forward")
    toy_catalogue.write_index()
    kept(), kept()
    large, large_pending = kept()
    assert large_pending - small_pending == added
    assert (large - small) / added <= 4, (small, large)  # 3 here; about 8 with a record per index row and patch


def test_a_patch_whose_every_variant_is_native_waits_for_its_upstreams_package_then_is_decided(toy_catalogue):
    up = toy_catalogue.upstream
    toy_catalogue.declare("native_only", "toy.native_only",
                          variants=f'(Variant(requires={{{up.name!r}: ">=1"}}, native="upstream does it"),)')
    toy_catalogue.write_index()
    engine = toy_catalogue.engine()
    status = {s.id: s for s in engine.apply_all()}["toy.native_only"]
    assert (status.state, status.waiting_for) == (State.PENDING, (up.package,))
    importlib.import_module(up.package)
    status = engine.status("toy.native_only")[0]
    assert (status.state, status.reason, status.detail) == (State.SKIPPED, Reason.NATIVE, "upstream does it")


def test_a_patch_native_on_the_installed_release_is_settled_when_its_upstream_is_imported(toy_catalogue):
    """Another variant installs into a module nobody imports: the patch must not wait for it forever
    where its installed release has the native variant."""
    up = toy_catalogue.upstream
    toy_catalogue.declare("native_here", "toy.native_here", variants=(
        f'(Variant(requires={{{up.name!r}: "<1"}}, installs=(Wrap({up.package + ".never_imported:f"!r}, '
        f'"._impl:plus_100"),)), Variant(requires={{{up.name!r}: ">=1"}}, native="upstream does it from 1"))'))
    toy_catalogue.write_index()
    engine = toy_catalogue.engine()
    status = {s.id: s for s in engine.apply_all()}["toy.native_here"]
    assert status.state is State.PENDING and up.package in status.waiting_for
    importlib.import_module(up.package)
    status = engine.status("toy.native_here")[0]
    assert (status.state, status.reason, status.detail) == (State.SKIPPED, Reason.NATIVE, "upstream does it from 1")


def test_a_distribution_every_variant_requires_missing_skips_from_the_index_alone(toy_catalogue):
    up = toy_catalogue.upstream
    toy_catalogue.declare("pair_of_dists", "toy.pair_of_dists", variants=(
        f'(Variant(requires={{{up.name!r}: ">=1", "not-installed-dist": ">=1"}}, '
        f'installs=(Wrap({up.target("Model.forward")!r}, "._impl:plus_100"),)),)'))
    toy_catalogue.write_index()
    status = {s.id: s for s in toy_catalogue.engine().apply_all()}["toy.pair_of_dists"]
    assert (status.state, status.reason, status.detail) == (State.SKIPPED, Reason.NOT_INSTALLED,
                                                            "not-installed-dist not installed")
    assert status.versions == {up.name: up.version, "not-installed-dist": None}
    assert f"{toy_catalogue.name}.{catalogue.DECLARATIONS_MODULE}" not in sys.modules


def test_importing_targets_of_an_undecided_patch_imports_only_its_chosen_variants_modules(toy_catalogue):
    """Waiting undecided means waiting for any variant's modules; `patchkit status` imports only the
    chosen variant's (another variant's module may not exist in the installed release)."""
    engine = toy_catalogue.engine()
    try:
        engine.apply_all(enable="toy.forward")
        assert engine.import_targets()[1].state is State.APPLIED
    finally:
        engine.revert_all()


# -- a stale index never drops a patch -----------------------------------------------------------


def test_a_declaration_module_missing_from_the_index_is_imported_at_load_with_a_warning(toy_catalogue, caplog):
    toy_catalogue.declare("newcomer", "toy.newcomer")
    toy_catalogue.declare("fam.other", "toy.family_newcomer")
    with caplog.at_level(logging.WARNING):
        records, errors = catalogue.load(toy_catalogue.name)
    assert not errors
    assert ids(records) == ["toy.family_member", "toy.family_newcomer", "toy.forward", "toy.newcomer"]
    assert "is stale" in caplog.text and f"{toy_catalogue.name}.up.newcomer is not in it" in caplog.text
    assert f"{toy_catalogue.name}.up.forward" not in sys.modules  # the indexed ones stay unimported


def test_a_declaration_module_removed_since_the_index_is_left_out_with_a_warning(toy_catalogue, caplog):
    toy_catalogue.remove("forward")
    with caplog.at_level(logging.WARNING):
        records, _ = catalogue.load(toy_catalogue.name)
    assert ids(records) == ["toy.family_member"]
    assert f"{toy_catalogue.name}.up.forward is gone" in caplog.text


def test_a_declaration_changed_since_the_index_wins_when_it_installs(toy_catalogue, caplog):
    engine = toy_catalogue.engine()
    toy_catalogue.declare("forward", "toy.forward", factory="plus_200")  # the index still says plus_100
    try:
        with caplog.at_level(logging.WARNING):
            engine.apply_all()
            core = toy_catalogue.upstream.import_core()
        assert engine.status("toy.forward")[0].state is State.APPLIED
        assert core.Model().forward(1) == 202
        assert "otherwise than the catalogue's index" in caplog.text
        assert engine.patch("toy.forward").variants[0].installs[0].factory == "._impl:plus_200"
    finally:
        engine.revert_all()


def test_a_declaration_gone_since_the_index_fails_its_patch_when_it_would_install(toy_catalogue):
    engine = toy_catalogue.engine()
    toy_catalogue.declare("forward", "toy.renamed")
    try:
        engine.apply_all()
        core = toy_catalogue.upstream.import_core()
        status = engine.status("toy.forward")[0]
        assert status.state is State.FAILED and "no longer declares toy.forward" in (status.error or "")
        assert core.Model().forward(1) == 2
    finally:
        engine.revert_all()


def test_without_an_index_every_declaration_module_is_imported(toy_catalogue):
    for name in ("_index.py", "_index_declarations.py"):
        (toy_catalogue.root / toy_catalogue.name / name).unlink()
    toy_catalogue.forget()
    records, errors = catalogue.load(toy_catalogue.name)
    assert not errors and sorted(r.patch.id for r in records) == ["toy.family_member", "toy.forward"]
    assert toy_catalogue.imported() == [f"{toy_catalogue.name}.up.fam", f"{toy_catalogue.name}.up.fam.scale",
                                        f"{toy_catalogue.name}.up.forward"]


# -- the shipped catalogue in a fresh process ------------------------------------------------------


def test_apply_all_imports_no_module_of_an_upstream_that_is_not_installed_yet_status_sees_every_patch():
    code = textwrap.dedent("""
        import importlib.metadata, json, sys
        try:
            importlib.metadata.distribution("vllm")
            raise SystemExit("this test needs an environment without vLLM")
        except importlib.metadata.PackageNotFoundError:
            pass
        import patchkit
        statuses = patchkit.apply_all()
        loaded = sorted(m for m in sys.modules if m.startswith("patchkit.patches.vllm"))
        declarations = sorted(m for m in sys.modules if m.startswith("patchkit.patches.")
                              and not m.startswith("patchkit.patches._index"))
        print(json.dumps({"vllm": loaded, "declarations": declarations, "ids": [s.id for s in statuses]}))
    """)
    try:
        importlib.metadata.distribution("vllm")
        pytest.skip("vLLM is installed in this environment")
    except importlib.metadata.PackageNotFoundError:
        pass
    found = last_printed(code, without=("PATCHKIT_",), timeout=120, check=True)
    assert found["vllm"] == []
    assert found["declarations"] == []  # nothing of the catalogue is imported here: no upstream is
    scanned, _ = catalogue.scan()
    assert sorted(found["ids"]) == sorted(r.patch.id for r in scanned)
    assert any(i.startswith("vllm.") for i in found["ids"])


def test_a_lazily_loaded_patch_installs_all_or_nothing(toy_catalogue):
    """Atomic on the lazy path too: a second target missing upstream leaves the first untouched."""
    up = toy_catalogue.upstream
    toy_catalogue.declare("pair", "toy.pair", variants=(
        f'(Variant(requires={{{up.name!r}: ">=1"}}, installs=(Wrap({up.target("Model.forward")!r}, "._impl:plus_100"), '
        f'Wrap({up.target("Model.no_such_method")!r}, "._impl:plus_100"))),)'))
    toy_catalogue.write_index()
    engine = toy_catalogue.engine()
    try:
        engine.apply_all(disable="toy.forward")
        core = up.import_core()
        status = engine.status("toy.pair")[0]
        assert (status.state, status.reason) == (State.SKIPPED, Reason.TARGET_MISSING)
        assert core.Model().forward(1) == 2
    finally:
        engine.revert_all()
