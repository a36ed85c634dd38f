"""Every upstream in ``patches/`` has the one shape docs/writing-patches.md describes.

Read statically with ``ast`` (no upstream is installed here; declaration modules, family packages and
``_errors`` leaves, which import nothing but patchkit, are imported), over every module of every
upstream, so a new module is checked the day it is added:

- layout: ``patches/<upstream>/`` holds its leaves (``_errors.py``, ``_constants.py``), family packages
  (``<family>/``), shared ``_checks/`` scaffolding, and, for a patch that is a family of one, its
  declaration and implementation directly; a family package holds declaration modules, their
  implementation, private modules the family shares, and ``_checks/``;
- a declaration module (public name, assigns ``PATCHES``) only declares: one ``Patch`` whose id is
  ``<upstream>.<module name>``, plain constants, imports from ``patchkit`` and the upstream's
  ``_constants`` leaf alone; no function, no class;
- its implementation is found from its id: every reference an install names is in the module
  ``_<id tail>`` or the package ``_<id tail>/`` beside the declaration; in such a package, a module per
  release span is named ``v<major><minor>`` after the first release it serves;
- a public helper API is a family package: its ``__init__`` binds only public names, imports nothing
  but the upstream's leaves and :mod:`patchkit.patches._exports`, and names in ``_EXPORTS`` where each
  lazily exported name is defined; no other public module that declares nothing (no private
  back-compat aliases, no second layout);
- no import cycle inside ``patches/`` (function-level imports count: a lazy cycle is still a cycle);
- implementation modules (``_*``) never import a public module of the catalogue (a declaration or a
  family's API): public modules sit on top, the leaves at the bottom (self-checks, like tests, sit
  above everything and may use the public API);
- the leaves ``_errors.py`` and ``_constants.py`` import nothing from ``patches/``;
- every exception class with a public name is defined in its upstream's ``_errors.py`` (self-check
  scaffolding aside), and is a ``patchkit.PatchkitError``;
- self-checks live in ``_checks/``: every ``self_check`` reference is ``._checks.<module>:<function>``
  naming a function defined there, only ``_checks/`` imports ``patchkit.selfcheck``, and patch code
  never imports ``_checks/``; no family keeps a ``_selfchecks`` module.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import patchkit
from patchkit import PatchkitError

CATALOGUE = Path(__file__).resolve().parents[2] / "patches"
PACKAGE = "patchkit.patches"
LEAVES = ("_errors", "_constants")
CHECKS = "_checks"
#: A module of an implementation package that serves one release span, named by its first release.
VERSION_MODULE = re.compile(r"^v\d{3}$")

#: Modules another branch is editing while this test lands; the lead conforms them at merge and then
#: deletes the entry. Each is (rule, module) -> why; the case is an expected failure (strict: once a
#: module conforms, its entry must go).
AWAITING_CONFORMANCE: dict[tuple[str, str], str] = {}


@dataclass
class Module:
    """One module of the catalogue, by its dotted name below ``patchkit.patches``."""

    name: str
    path: Path
    tree: ast.Module
    imports: set[str] = field(default_factory=set)

    @property
    def upstream(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def package(self) -> str:
        """The package relative references in this module resolve against."""
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @property
    def parts(self) -> list[str]:
        return self.name.split(".")

    @property
    def leaf_name(self) -> str:
        return self.parts[-1]

    @property
    def in_checks(self) -> bool:
        return CHECKS in self.parts[1:]

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def declares(self) -> bool:
        return any(isinstance(node, (ast.Assign, ast.AnnAssign)) and "PATCHES" in _targets(node)
                   for node in self.tree.body)

    @property
    def is_public(self) -> bool:
        """A declaration module or a family package (the public API): no part of its name is private."""
        return not any(part.startswith("_") for part in self.parts)

    @property
    def is_family(self) -> bool:
        return self.is_package and len(self.parts) == 2 and self.is_public


def _targets(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _modules() -> dict[str, Module]:
    found = {}
    for path in sorted(CATALOGUE.rglob("*.py")):
        relative = path.relative_to(CATALOGUE).with_suffix("")
        parts = list(relative.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) < 2:  # patches/__init__.py and the catalogue-wide modules (entry_points, _exports)
            continue
        name = ".".join(parts)
        found[name] = Module(name, path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    for module in found.values():
        module.imports = _imports_of(module, found)
    return found


def _imports_of(module: Module, modules: dict[str, Module]) -> set[str]:
    """The catalogue modules ``module`` imports anywhere in its body (a ``from . import x`` of a
    submodule counts as importing that submodule)."""
    package = module.parts if module.is_package else module.parts[:-1]
    named: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and node.module.startswith(PACKAGE + "."):
                target = node.module[len(PACKAGE) + 1:]
            else:
                continue
            for alias in node.names:
                named.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        elif isinstance(node, ast.Import):
            named.update(alias.name[len(PACKAGE) + 1:] for alias in node.names
                         if alias.name.startswith(PACKAGE + "."))
    return {name for name in named if name in modules and name != module.name}


MODULES = _modules()
UPSTREAMS = sorted({module.upstream for module in MODULES.values()})
ALL = sorted(MODULES)


def _cases(rule: str, names: list[str]) -> list[object]:
    return [
        pytest.param(name, id=name, marks=pytest.mark.xfail(strict=True, reason=AWAITING_CONFORMANCE[(rule, name)]))
        if (rule, name) in AWAITING_CONFORMANCE else pytest.param(name, id=name)
        for name in names
    ]


def _cycles(names: list[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), among ``names``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in sorted(MODULES[name].imports):
            if other not in names:
                continue
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == name:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in names:
        if name not in index:
            visit(name)
    return cycles


def test_the_catalogue_is_read():
    assert {"megatron", "modelopt", "bridge", "vllm"} <= set(UPSTREAMS)
    assert sum(module.declares for module in MODULES.values()) >= 10
    assert {"megatron.mtp", "megatron.router_replay", "modelopt.qat", "bridge.qat"} <= {
        name for name, module in MODULES.items() if module.is_family}


@pytest.mark.parametrize("upstream", _cases("no_cycles", UPSTREAMS))
def test_no_import_cycle_inside_an_upstream(upstream):
    names = [name for name in ALL if MODULES[name].upstream == upstream]
    assert _cycles(names) == []


def test_no_import_cycle_across_the_catalogue():
    cross = [c for c in _cycles(ALL) if len({MODULES[n].upstream for n in c}) > 1]
    assert cross == []


def _is_constant_expression(node: ast.expr) -> bool:
    """Literals, names of other constants, f-strings and containers of them: data, nothing run."""
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(v, ast.Constant) or (isinstance(v, ast.FormattedValue)
                                                    and _is_constant_expression(v.value)) for v in node.values)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_constant_expression(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _is_constant_expression(k) for k in node.keys) and all(
            _is_constant_expression(v) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _is_constant_expression(node.left) and _is_constant_expression(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _DECLARING:
        return all(_is_constant_expression(a) for a in node.args) and all(
            _is_constant_expression(k.value) for k in node.keywords)
    return False


#: patchkit's declaration types: building one is data, not code.
_DECLARING = {"Patch", "Variant", "Replace", "Wrap", "Add", "Call"}


def _is_declaration_statement(node: ast.stmt) -> bool:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return True  # the docstring
    if isinstance(node, ast.ImportFrom):  # patchkit, or the upstream's _constants leaf (checked below)
        return (node.level == 0 and node.module in ("__future__", "patchkit", "typing")) or (
            node.level > 0 and node.module == "_constants")
    if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        if "PATCHES" in _targets(node):
            return True
        return node.value is not None and _is_constant_expression(node.value)
    return False


DECLARATIONS = [name for name in ALL if MODULES[name].is_public and MODULES[name].declares]
FAMILY_PACKAGES = [name for name in ALL if MODULES[name].is_family]


@pytest.mark.parametrize("name", _cases("declaration_only_declares", DECLARATIONS))
def test_a_declaration_module_only_declares(name):
    module = MODULES[name]
    others = [f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}"
              for node in module.tree.body if not _is_declaration_statement(node)]
    assert others == [], f"{name} does more than declare (move code to an implementation module)"
    assert module.imports <= {f"{module.upstream}._constants"}, f"{name} imports {sorted(module.imports)}"


def _declared_ids(module: Module) -> list[str]:
    ids = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "Patch":
            ids.extend(k.value.value for k in node.keywords
                       if k.arg == "id" and isinstance(k.value, ast.Constant))
    return ids


@pytest.mark.parametrize("name", _cases("declaration_named_after_patch", DECLARATIONS))
def test_a_declaration_module_declares_one_patch_named_after_it(name):
    module = MODULES[name]
    assert _declared_ids(module) == [f"{module.upstream}.{module.leaf_name}"]


@pytest.mark.parametrize("name", _cases("implementation_below_api", ALL))
def test_implementation_modules_never_import_the_public_modules(name):
    module = MODULES[name]
    # Self-checks drive the public API, as tests do; ``_api`` modules hold the functions of a family's
    # API (its package exports them) and sit with it on top.
    if module.is_public or module.in_checks or module.leaf_name == "_api":
        return
    public = sorted(other for other in module.imports if MODULES[other].is_public)
    assert public == [], f"{name} imports the public module(s) {public}: move what it needs below them"


LEAF_MODULES = [name for name in ALL if MODULES[name].leaf_name in LEAVES]


@pytest.mark.parametrize("name", LEAF_MODULES)
def test_leaf_modules_sit_at_the_upstream(name):
    assert len(MODULES[name].parts) == 2, f"{name}: the leaves are patches/<upstream>/_errors.py and _constants.py"


@pytest.mark.parametrize("name", _cases("leaf_imports_nothing", LEAF_MODULES))
def test_leaf_modules_import_nothing_from_the_catalogue(name):
    assert MODULES[name].imports == set()
    relative = [ast.unparse(n) for n in ast.walk(MODULES[name].tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert relative == []


_EXCEPTION_BASES = {"BaseException", "Exception", "ArithmeticError", "LookupError", "ValueError", "TypeError",
                    "RuntimeError", "KeyError", "IndexError", "AttributeError", "NotImplementedError", "OSError",
                    "ImportError", "AssertionError"}


def _exception_classes(module: Module) -> list[str]:
    """Classes of ``module`` that derive (by name, within the module) from an exception class."""
    known = set(_EXCEPTION_BASES)
    found = []
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {ast.unparse(base).rpartition(".")[2] for base in node.bases}
        if bases & known or any(base.endswith(("Error", "Exception")) for base in bases):
            known.add(node.name)
            found.append(node.name)
    return found


@pytest.mark.parametrize("name", _cases("errors_in_leaf", ALL))
def test_public_exception_classes_are_defined_in_the_errors_leaf(name):
    module = MODULES[name]
    if module.leaf_name == "_errors" or module.in_checks:
        return
    public = [cls for cls in _exception_classes(module) if not cls.startswith("_")]
    assert public == [], f"{name} defines {public}: define them in {module.upstream}._errors"


@pytest.mark.parametrize("upstream", [u for u in UPSTREAMS if f"{u}._errors" in MODULES])
def test_every_public_error_of_an_upstream_is_a_patchkit_error(upstream):
    errors = importlib.import_module(f"{PACKAGE}.{upstream}._errors")
    classes = [value for value in vars(errors).values()
               if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__]
    assert classes, f"{upstream}._errors defines no error"
    assert [cls.__name__ for cls in classes if not issubclass(cls, PatchkitError)] == []
    assert [cls.__name__ for cls in classes if cls.__name__.startswith("_")] == []
    statically = set(_exception_classes(MODULES[f"{upstream}._errors"]))
    assert statically == {cls.__name__ for cls in classes}


def test_patchkit_error_is_the_root_the_errors_name():
    assert patchkit.PatchkitError is PatchkitError


def _self_check_references(module: Module) -> list[str]:
    return [k.value.value for node in ast.walk(module.tree) if isinstance(node, ast.Call)
            for k in node.keywords if k.arg == "self_check" and isinstance(k.value, ast.Constant)]


@pytest.mark.parametrize("name", _cases("self_checks_in_checks", DECLARATIONS))
def test_self_checks_are_functions_of_the_checks_package(name):
    module = MODULES[name]
    references = _self_check_references(module)
    assert references, f"{name} declares no self_check"
    for reference in references:
        target, _, function = reference.partition(":")
        assert target.startswith(f".{CHECKS}."), f"{name}: {reference} is not in the family's {CHECKS}/"
        checks = MODULES.get(f"{module.package}{target}")
        assert checks is not None, f"{name}: {reference} names a module that does not exist"
        defined = {n.name for n in checks.tree.body if isinstance(n, ast.FunctionDef)}
        assert function in defined, f"{name}: {checks.name} defines no {function}()"


@pytest.mark.parametrize("name", _cases("checks_apart", ALL))
def test_self_check_scaffolding_stays_in_checks(name):
    module = MODULES[name]
    assert module.leaf_name != "_selfchecks", f"{name}: self-checks live in {module.package}.{CHECKS}/"
    if module.in_checks:
        return
    uses_selfcheck = [ast.unparse(n) for n in ast.walk(module.tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                      and "patchkit.selfcheck" in ast.unparse(n)]
    assert uses_selfcheck == [], f"{name} imports patchkit.selfcheck outside {CHECKS}/"
    into_checks = sorted(other for other in module.imports if MODULES[other].in_checks)
    assert into_checks == [], f"{name}: patch code imports self-check scaffolding {into_checks}"


def _implementation_owner(module: Module) -> str | None:
    """The declaration whose implementation ``module`` is (``_<tail>`` or inside ``_<tail>/``), if any."""
    for depth in range(2, len(module.parts) + 1):
        head = module.parts[:depth]
        if head[-1].startswith("_") and head[-1][1:]:
            declaration = ".".join([*head[:-1], head[-1][1:]])
            if declaration in DECLARATIONS:
                return declaration
    return None


@pytest.mark.parametrize("name", _cases("layout", ALL))
def test_every_module_has_a_place_in_the_layout(name):
    module = MODULES[name]
    parts = module.parts
    if len(parts) == 1:
        assert module.is_package  # patches/<upstream>/__init__.py
        return
    if module.in_checks:
        checks = parts.index(CHECKS)
        assert checks in (1, 2) and len(parts) <= checks + 2, (
            f"{name}: {CHECKS}/ sits in an upstream or a family package and does not nest")
        return
    if module.is_public:
        assert len(parts) in (2, 3), f"{name}: a declaration sits in its upstream or in a family package"
        assert module.declares or module.is_family, (
            f"{name}: a public module that declares no patch; a public API is a family package's __init__")
        assert len(parts) == 2 or not module.is_package, f"{name}: a family package holds no public sub-package"
        return
    owner = _implementation_owner(module)
    if owner is not None:
        inside = parts[len(MODULES[owner].parts):]
        if module.is_package or not inside:
            return  # _<tail>.py or _<tail>/__init__.py
        assert len(inside) == 1, f"{name}: an implementation package ({owner}) does not nest"
        if re.match(r"^v\d", inside[0]):
            assert VERSION_MODULE.match(inside[0]), f"{name}: a release module is named v<major><minor> (v014)"
        return
    # A private module the upstream or a family shares: never inside another module's package.
    assert len(parts) <= 3 and not module.is_package, (
        f"{name}: a private package must be the implementation of a patch (_<id tail>/) or {CHECKS}/")


def _references(declaration: str) -> list[str]:
    """The string references the installs of ``declaration``'s patches name (replacement code)."""
    found = []
    for patch in importlib.import_module(f"{PACKAGE}.{declaration}").PATCHES:
        for variant in patch.variants:
            for action in variant.installs:
                values = [getattr(action, field, None) for field in ("replacement", "factory", "value", "install",
                                                                      "uninstall")]
                found.extend(v for v in values if isinstance(v, str))
    return found


@pytest.mark.parametrize("name", _cases("implementation_named_after_patch", DECLARATIONS))
def test_a_patch_s_implementation_is_found_from_its_id(name):
    module = MODULES[name]
    implementation = f"_{module.leaf_name}"
    for reference in _references(name):
        target = reference.partition(":")[0]
        assert target.startswith("."), f"{name}: {reference} is not relative to the declaration's package"
        first = target[1:].split(".")[0]
        assert first == implementation, (
            f"{name}: {reference} is not in {implementation}.py or {implementation}/ beside the declaration")
        assert f"{module.package}{target}" in MODULES, f"{name}: {reference} names a module that does not exist"


def _top_level_names(module: Module) -> set[str]:
    names: set[str] = set()
    for node in module.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names |= _targets(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


@pytest.mark.parametrize("name", _cases("api_in_family_package", FAMILY_PACKAGES))
def test_a_family_package_s_api_is_lazy_and_names_where_each_name_is_defined(name):
    module = MODULES[name]
    package = importlib.import_module(f"{PACKAGE}.{name}")  # cheap: no upstream, no torch
    exports = getattr(package, "_EXPORTS", {})
    public = [n for n in getattr(package, "__all__", [])]
    bound = {n for n in vars(package) if not n.startswith("_")} - {"annotations", "TYPE_CHECKING"}
    submodules = {other.leaf_name for other in MODULES.values() if other.package == module.name}
    assert sorted(public) == sorted(set(exports) | (bound - submodules)), (
        f"{name}.__all__ must list exactly its lazily exported names and the names it binds")
    private_aliases = [f"{alias.name} as {alias.asname}" for node in module.tree.body
                       if isinstance(node, ast.ImportFrom) for alias in node.names
                       if alias.asname and alias.asname.startswith("_") and not alias.name.startswith("_")]
    assert private_aliases == [], f"{name} keeps private aliases {private_aliases}"
    at_import = Module(module.name, module.path, ast.Module(
        body=[node for node in module.tree.body if isinstance(node, (ast.Import, ast.ImportFrom))], type_ignores=[]))
    eager = sorted(other for other in _imports_of(at_import, MODULES) if other.rpartition(".")[2] not in LEAVES)
    assert eager == [], f"{name} imports {eager} when imported: export their names through _EXPORTS"
    for exported, relative in exports.items():
        target = importlib.util.resolve_name(relative, f"{PACKAGE}.{name}")[len(PACKAGE) + 1:]
        assert target in MODULES, f"{name}: {exported} is exported from {relative}, which does not exist"
        assert exported in _top_level_names(MODULES[target]), f"{name}: {target} does not define {exported}"
