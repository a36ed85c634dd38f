"""``patchkit matrix check | record | static | index | catalogue | outdated | merge | table | grid``.

``patchkit``'s cli.py hands it the arguments after ``matrix``.

Which matrix file: ``--matrix PATH``; else ``./compat_matrix.yaml``; else the matrix shipped with
patchkit. The shipped one is only read, never written, unless patchkit runs from a source checkout
(where it is the repository's file): the commands that write (``record``, ``merge``, ``index``,
``static --record``/``--refingerprint``) refuse to change an installed package and ask for ``--matrix``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..runtime.catalogue import Registered
from ..runtime.errors import ConfigError
from .loader import FILENAME, default_path

if TYPE_CHECKING:
    from .model import Matrix


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")


def _matrix_path(args: argparse.Namespace, writing: bool = False) -> Path:
    """``--matrix``, else ./compat_matrix.yaml (a checkout), else the matrix shipped with patchkit.

    ``writing``: the shipped matrix of an installed patchkit is refused (ConfigError): the default
    never writes into site-packages. A missing file is found by ``load`` (MatrixError, exit 2).
    """
    if args.matrix is not None:
        return Path(args.matrix)
    local = Path(FILENAME)
    if local.is_file():
        return local
    shipped = default_path()
    if shipped is None:
        raise ConfigError("--matrix", "(not given)", f"a matrix file, e.g. --matrix {FILENAME}",
                          problem=f"required (no ./{FILENAME} here and none shipped with patchkit)")
    if writing and not in_source_checkout(shipped):
        raise ConfigError("--matrix", "(not given)", f"the matrix file to write, e.g. --matrix ./{FILENAME}",
                          problem=f"required to write (the default is the installed package's {shipped}, "
                                  "which patchkit never changes)")
    return shipped


def in_source_checkout(shipped: Path) -> bool:
    """Whether the shipped matrix is the repository's own file (a source checkout or an editable
    install: the package's matrix is a link to the root file, beside pyproject.toml)."""
    resolved = shipped.resolve()
    return (resolved.parent / "pyproject.toml").is_file() and (resolved.parent / "patchkit").is_dir()


def _registry() -> list[Registered]:
    """Every shipped patch as its module declares it (each declaration module imported, not the index)."""
    from ..runtime.catalogue import scan

    patches, errors = scan()
    for error in errors:
        sys.stderr.write(f"patchkit: cannot load {error.module}: {error.error}\n")
    if errors:
        raise SystemExit(1)
    return patches


def _read_input(path: Path, option: str) -> str:
    """A file named on the command line, as text; ConfigError (exit 2) if it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(option, str(path), "a readable UTF-8 text file", problem=f"unreadable ({why})") from None


def _diff_or_write(path: Path, old: str, new: str, check: bool, option: str = "--matrix") -> int:
    if old == new:
        _write(f"{path}: up to date")
        return 0
    if check:
        diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(path), f"{path} (expected)")
        sys.stdout.writelines(diff)
        _write(f"{path} is stale: run the command without --check and commit the result")
        return 1
    try:
        path.write_text(new, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(option, str(path), "a file that can be written",
                          problem=f"not writable ({exc.strerror or repr(exc)})") from None
    _write(f"{path}: updated")
    return 0


def _symbols_file(path: Path) -> dict[str, dict[str, list[str]]]:
    """``--symbols FILE``: {dist: {versions: [...], symbols: [...]}}; ConfigError naming what is wrong."""
    import yaml

    shape = "YAML {dist: {versions: [...], symbols: [...]}}"
    try:
        wanted = yaml.safe_load(_read_input(path, "--symbols"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        why = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError("--symbols", str(path), shape, problem=f"not valid YAML{where} ({why})") from None
    if not isinstance(wanted, dict):
        raise ConfigError("--symbols", str(path), shape, problem=f"not a mapping ({type(wanted).__name__})")
    for dist, spec in wanted.items():
        if not (isinstance(spec, dict) and all(isinstance(spec.get(k), list) for k in ("versions", "symbols"))):
            raise ConfigError("--symbols", str(path), shape, problem=f"malformed at {dist!r}")
    return wanted


def _write_matrix(path: Path, old: str, new: str, matrix: "Matrix", check: bool = False) -> int:
    """Write the matrix (or check it), and the runtime's index with it when it is the shipped matrix."""
    status = _diff_or_write(path, old, new, check)
    from . import index

    if index.is_shipped(path):
        current = index.PATH.read_text(encoding="utf-8") if index.PATH.is_file() else ""
        status = max(status, _diff_or_write(index.PATH, current, index.render(matrix), check))
    return status


def _check(args: argparse.Namespace) -> int:
    from . import check, index, load

    path = _matrix_path(args)
    matrix = load(path)
    problems = check.check(matrix, _registry())
    for problem in problems:
        _write(str(problem))
    if index.is_shipped(path) and (not index.PATH.is_file()
                                   or index.PATH.read_text(encoding="utf-8") != index.render(matrix)):
        problems.append(check.Disagreement(None, f"{index.PATH} is out of step with {path}: run `patchkit matrix "
                                                 f"index` and commit the result"))
        _write(str(problems[-1]))
    from . import catalogue_index

    if catalogue_index.is_stale():
        problems.append(check.Disagreement(None, f"the catalogue's index in {catalogue_index.folder()} is out of step "
                                                 f"with the declarations: "
                                                 f"run `patchkit matrix catalogue` and commit the result"))
        _write(str(problems[-1]))
    _write(f"{path}: {'registry and matrix agree' if not problems else f'{len(problems)} disagreement(s)'}")
    return 1 if problems else 0


def _record(args: argparse.Namespace) -> int:
    from . import load, record, writer

    path = _matrix_path(args, writing=not args.check)
    matrix = load(path)  # MatrixError first, for a malformed file
    old = _read_input(path, "--matrix")
    updated = record.record(matrix, _registry(), args.env)
    return _write_matrix(path, old, writer.replace_patches(old, updated.patches), updated, args.check)


def _index(args: argparse.Namespace) -> int:
    from . import index, load

    path = _matrix_path(args)
    if not args.check and not in_source_checkout(index.PATH.parents[2] / "patchkit" / FILENAME):
        raise ConfigError("index", str(index.PATH), "a source checkout of patchkit",
                          problem="not written (it belongs to the installed package)")
    current = index.PATH.read_text(encoding="utf-8") if index.PATH.is_file() else ""
    return _diff_or_write(index.PATH, current, index.render(load(path)), args.check)


def _catalogue(args: argparse.Namespace) -> int:
    from . import catalogue_index

    where = catalogue_index.folder(args.package)
    if args.check:
        old, new = catalogue_index.current(args.package), catalogue_index.render(args.package)
        return max(_diff_or_write(where / name, old[name], text, check=True, option="--package")
                   for name, text in new.items())
    _write(f"{where}: index {'updated' if catalogue_index.write(args.package) else 'up to date'}")
    return 0


def _static(args: argparse.Namespace) -> int:
    from . import static
    from .artifacts import DEFAULT_CACHE

    cache = Path(args.cache) if args.cache else DEFAULT_CACHE
    if args.symbols:
        wanted = _symbols_file(Path(args.symbols))
        rows = [obs for dist, spec in wanted.items()
                for obs in static.survey(dist, [str(v) for v in spec["versions"]], spec["symbols"], cache)]
        if args.json:
            _write(json.dumps([{"distribution": o.distribution, "version": o.version, "symbol": o.symbol,
                                "change": o.change, **o.facts.__dict__} for o in rows], indent=1))
        else:
            for o in rows:
                f = o.facts
                where = f" ({f.defined_at})" if f.status == "inherited" else ""
                found = f" {f.text_hash} {f.fingerprint} {o.change}".rstrip() + f" {f.signature}" if f.signature else ""
                _write(f"{o.distribution} {o.version} {o.symbol}: {f.status}{where}{found}")
        return 0
    from . import load, writer

    path = _matrix_path(args, writing=args.record or args.refingerprint)
    if args.refingerprint:
        findings, updated = static.refingerprint(load(path), cache)
    else:
        add = [_release(text) for spec in args.add for text in spec.split(",")]
        findings, updated = static.verify_matrix(load(path), _registry(), cache, record=args.record, add=add)
    for finding in findings:
        _write(f"{'ok  ' if finding.ok else 'FAIL'} {finding.patch_id} [{finding.variant}] {finding.versions}: "
               f"{finding.target}: {finding.message}")
    failed = sum(not f.ok for f in findings)
    _write(f"{len(findings)} target checks, {failed} failed")
    if (args.record or args.refingerprint) and not failed:
        old = _read_input(path, "--matrix")
        _write_matrix(path, old, writer.replace_patches(old, updated.patches), updated)
    return 1 if failed else 0


def _merge(args: argparse.Namespace) -> int:
    from . import load, writer
    from .merge import merge_contribution

    path = _matrix_path(args, writing=not args.check)
    matrix, contribution = load(path), load(Path(args.file))  # missing or malformed: MatrixError, exit 2
    old = _read_input(path, "--matrix")
    updated = merge_contribution(matrix, contribution, _registry())
    return _write_matrix(path, old, writer.replace_patches(old, updated.patches), updated, args.check)


def _outdated(args: argparse.Namespace) -> int:
    from . import load
    from .artifacts import DEFAULT_CACHE
    from .outdated import ATTENTION, newest_recorded, outdated, render

    matrix = load(_matrix_path(args))
    registry = _registry()
    found = outdated(matrix, registry, args.dist, cache=Path(args.cache) if args.cache else DEFAULT_CACHE)
    if args.json:
        _write(json.dumps([a.to_dict() for a in found], indent=1))
    else:
        dists = args.dist or sorted({d for r in registry for d in r.patch.distributions})
        _write(render(found, {d: newest_recorded(matrix, d) for d in dists}))
    return 1 if any(a.verdict == ATTENTION for a in found) else 0


def _release(text: str) -> tuple[str, str]:
    dist, sep, version = text.strip().partition("==")
    if not sep or not dist or not version:
        raise ConfigError("--add", text, "DIST==VERSION[,DIST==VERSION...], e.g. vllm==0.16.0")
    return dist, version


def _table(args: argparse.Namespace) -> int:
    from . import load, table

    readme = Path(args.readme)
    old = _read_input(readme, "--readme")
    matrix, registry = load(_matrix_path(args)), _registry()
    writers = {
        (table.START, table.END): lambda text: table.update(text, matrix, readme.name, table.ranges_of(registry)),
        (table.CATALOGUE_START, table.CATALOGUE_END): lambda text: table.update_catalogue(text, matrix, registry,
                                                                                          readme.name),
        (table.SUMMARY_START, table.SUMMARY_END): lambda text: table.update_summary(text, matrix, registry,
                                                                                   readme.name),
    }
    found = [markers for markers in writers if table.has_markers(old, *markers)]
    if not found:
        named = ", ".join(f"{start} ... {end}" for start, end in writers)
        sys.stderr.write(f"patchkit: {readme.name} has none of the table markers ({named}); "
                         "add them where a table belongs\n")
        return 2
    new = old
    for markers in found:
        new = writers[markers](new)
    return _diff_or_write(readme, old, new, args.check, "--readme")


def _grid(args: argparse.Namespace) -> int:
    from . import grid, load

    sections = grid.build(load(_matrix_path(args)), _registry())
    status = 0
    for path, render, option in ((args.markdown, grid.render_markdown, "--markdown"),
                                 (args.html, grid.render_html, "--html")):
        if path:
            target = Path(path)
            old = _read_input(target, option) if target.exists() else ""
            status = max(status, _diff_or_write(target, old, render(sections), args.check, option))
    return status


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``patchkit matrix ...`` (``patchkit`` hands it the arguments after ``matrix``)."""
    matrix = argparse.ArgumentParser(prog="patchkit matrix",
                                     description="compat_matrix.yaml: check it against the registry, record "
                                                 "an environment, verify releases statically, merge doctor "
                                                 "records, write the README table.")
    matrix.add_argument("-v", "--verbose", action="store_true", help="say more (patchkit's log at INFO)")
    sub = matrix.add_subparsers(dest="matrix_command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help)
        parser.add_argument("--matrix", help=f"the matrix file (default: ./{FILENAME}, else the shipped one, "
                                             "which is only read outside a source checkout)")
        parser.set_defaults(run=run)
        return parser

    command("check", _check, "the patch registry and the matrix agree")
    record = command("record", _record, "write this environment's versions and fingerprints into the matrix")
    record.add_argument("--env", required=True, help="the environment (a key of `environments`) that just passed")
    record.add_argument("--check", action="store_true", help="write nothing; exit 1 if recording would change the file")
    static = command("static", _static, "verify the matrix's versions from downloaded release artifacts")
    static.add_argument("--cache", help="where artifacts are unpacked (default: ~/.cache/patchkit/artifacts)")
    static.add_argument("--record", action="store_true",
                        help="fill in missing fingerprints and add 'static' to verified_by")
    static.add_argument("--add", action="append", default=[], metavar="DIST==VERSION[,...]",
                        help="also check these releases for every variant whose range holds them (recorded "
                             "with --record)")
    static.add_argument("--refingerprint", action="store_true",
                        help="recompute every recorded fingerprint from its artifact with today's fingerprint "
                             "function (after a fingerprint format change) and write them")
    static.add_argument("--symbols",
                        help="survey the symbols of a YAML file {dist: {versions: [...], symbols: [...]}} instead")
    static.add_argument("--json", action="store_true", help="with --symbols: machine-readable facts")
    index = command("index", _index, "write patchkit/runtime/_recorded.py, the runtime's copy of the records")
    index.add_argument("--check", action="store_true", help="write nothing; exit 1 if the index is stale")
    catalogue = command("catalogue", _catalogue, "write the catalogue's index (patches/_index*.py), read at start-up")
    catalogue.add_argument("--check", action="store_true", help="write nothing; exit 1 if the index is stale")
    catalogue.add_argument("--package", default="patchkit.patches", help="the catalogue package (default: %(default)s)")
    outdated = command("outdated", _outdated, "releases on the index newer than the matrix covers, checked statically")
    outdated.add_argument("--dist", action="append", default=[], help="only this distribution (repeatable)")
    outdated.add_argument("--cache", help="where artifacts are unpacked (default: ~/.cache/patchkit/artifacts)")
    outdated.add_argument("--json", action="store_true", help="machine-readable assessments")
    merge = command("merge", _merge, "fold records from `patchkit doctor --record FILE` into the matrix")
    merge.add_argument("file", help="the records file a doctor run wrote")
    merge.add_argument("--check", action="store_true", help="write nothing; exit 1 if merging would change the file")
    table = command("table", _table,
                    "write the supported-versions table, the catalogue table and its summary between their markers")
    table.add_argument("--readme", default="README.md")
    table.add_argument("--check", action="store_true", help="write nothing; exit 1 if the table is stale")
    grid = command("grid", _grid, "write the compatibility grid (patches down, releases across)")
    grid.add_argument("--markdown", default="docs/compatibility.md", help="the Markdown page ('' for none)")
    grid.add_argument("--html", default="docs/compatibility.html", help="the standalone HTML page ('' for none)")
    grid.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    return matrix
