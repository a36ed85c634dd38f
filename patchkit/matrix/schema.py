"""Reading ``compat_matrix.yaml``: its YAML nodes checked against the schema, with file positions.

The file is composed (``yaml.compose``), not loaded, so every value keeps the line and column it
came from; each problem names that position, the path to the value, what was expected and what
was found. Every problem in the file is reported at once, not just the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import yaml

from ..declaration import Target
from ..errors import DeclarationError, PatchkitError
from .model import STATUSES, Environment, Matrix, Position, TargetRecord, VersionRecord

SCHEMA_VERSION = 1

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_BOOL = "tag:yaml.org,2002:bool"
_ENV_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
_VERIFIED_BY = re.compile(r"^(static|tests:[a-z0-9][a-z0-9._-]*)$")
_PATCH_ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
_TAG_NAMES = {_STR: "a string", _INT: "an integer", _BOOL: "a boolean", "tag:yaml.org,2002:float": "a number",
              "tag:yaml.org,2002:null": "nothing (null)"}

T = TypeVar("T")


@dataclass(frozen=True)
class Problem:
    position: Position
    where: str
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.position}: {self.where}: expected {self.expected}, found {self.found}"


class MatrixError(PatchkitError, ValueError):
    """``compat_matrix.yaml`` is not valid YAML or does not follow the schema."""

    def __init__(self, path: str, problems: list[Problem]) -> None:
        self.path = path
        self.problems = tuple(problems)
        listed = "\n  ".join(str(problem) for problem in problems)
        super().__init__(f"{path}: {len(problems)} problem(s) in the compatibility matrix:\n  {listed}")


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    kind = _TAG_NAMES.get(node.tag, node.tag)
    return f"{kind} {node.value!r}" if node.value != "" else kind


class _Reader:
    """Walks the node tree, building the model and collecting problems."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def at(self, node: yaml.Node) -> Position:
        return Position(self.path, node.start_mark.line + 1, node.start_mark.column + 1)

    def problem(self, node: yaml.Node, where: str, expected: str, found: str | None = None) -> None:
        self.problems.append(Problem(self.at(node), where, expected, found if found is not None else _describe(node)))

    # -- primitives -------------------------------------------------------------------------------

    def mapping(self, node: yaml.Node, where: str, expected: str = "a mapping") -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """Keys (strings) to (key node, value node); duplicate and non-string keys are problems."""
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, where, expected)
            return {}
        found: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag != _STR:
                self.problem(key, where, "string keys", _describe(key))
                continue
            if key.value in found:
                first = self.at(found[key.value][0])
                self.problem(key, f"{where}.{key.value}", f"each key once (first at line {first.line})", "a duplicate key")
                continue
            found[key.value] = (key, value)
        return found

    def keys(self, fields: dict[str, tuple[yaml.Node, yaml.Node]], where: str, required: tuple[str, ...],
             optional: tuple[str, ...], node: yaml.Node) -> None:
        for name in required:
            if name not in fields:
                self.problem(node, where, f"a key {name!r}", f"keys {sorted(fields)}" if fields else "no keys")
        for name, (key, _) in fields.items():
            if name not in required + optional:
                self.problem(key, f"{where}.{name}", f"one of {', '.join(required + optional)}", f"unknown key {name!r}")

    def string(self, node: yaml.Node, where: str, expected: str = "a string") -> str | None:
        if isinstance(node, yaml.ScalarNode) and node.tag == _STR:
            return node.value
        self.problem(node, where, expected)
        return None

    def boolean(self, node: yaml.Node, where: str) -> bool | None:
        if isinstance(node, yaml.ScalarNode) and node.tag == _BOOL:
            return node.value.lower() in ("true", "yes", "on")
        self.problem(node, where, "true or false")
        return None

    def sequence(self, node: yaml.Node, where: str, expected: str = "a list") -> list[yaml.Node]:
        if isinstance(node, yaml.SequenceNode):
            return list(node.value)
        self.problem(node, where, expected)
        return []

    def strings(self, node: yaml.Node, where: str, expected: str = "a list of strings") -> tuple[str, ...]:
        items = self.sequence(node, where, expected)
        return tuple(s for i, item in enumerate(items) if (s := self.string(item, f"{where}[{i}]")) is not None)

    def optional(self, fields: dict[str, tuple[yaml.Node, yaml.Node]], name: str, read: Callable[[yaml.Node], T],
                 default: T) -> T:
        return read(fields[name][1]) if name in fields else default

    # -- the schema -------------------------------------------------------------------------------

    def document(self, root: yaml.Node | None) -> Matrix:
        if root is None:
            self.problems.append(Problem(Position(self.path, 1, 1), "the file", "a mapping with 'schema' and "
                                         "'environments'", "an empty document"))
            return Matrix(Path(self.path), SCHEMA_VERSION, {}, {})
        fields = self.mapping(root, "the file", "a mapping with 'schema' and 'environments'")
        self.keys(fields, "the file", ("schema", "environments"), ("patches",), root)
        schema = SCHEMA_VERSION
        if "schema" in fields:
            node = fields["schema"][1]
            if not (isinstance(node, yaml.ScalarNode) and node.tag == _INT and int(node.value) == SCHEMA_VERSION):
                self.problem(node, "schema", f"{SCHEMA_VERSION} (the schema version this patchkit reads)")
        environments = self.optional(fields, "environments", self.environments, {})
        patches = self.optional(fields, "patches", self.patches, {})
        positions = {name: self.at(key) for name, (key, _) in fields.items()}
        return Matrix(Path(self.path), schema, environments, patches, positions)

    def environments(self, node: yaml.Node) -> dict[str, Environment]:
        found = {}
        for name, (key, value) in self.mapping(node, "environments", "a mapping of environment names").items():
            where = f"environments.{name}"
            if not _ENV_NAME.match(name):
                self.problem(key, where, "an environment name of lowercase letters, digits, '.', '_' or '-'",
                             repr(name))
            fields = self.mapping(value, where)
            self.keys(fields, where, ("install", "tests"), ("uninstall", "env", "ci", "description"), value)
            install = tuple(
                self.strings(step, f"{where}.install[{i}]", "a list of pip arguments")
                for i, step in enumerate(self.optional(fields, "install",
                                                       lambda n: self.sequence(n, f"{where}.install",
                                                                               "a list of pip-argument lists"), []))
            )
            tests = self.optional(fields, "tests", lambda n: self.strings(n, f"{where}.tests", "a list of test paths"), ())
            if "tests" in fields and not tests and isinstance(fields["tests"][1], yaml.SequenceNode):
                self.problem(fields["tests"][1], f"{where}.tests", "at least one test path", "an empty list")
            env: dict[str, str] = {}
            for var, (_, val) in self.optional(fields, "env", lambda n: self.mapping(n, f"{where}.env"), {}).items():
                if isinstance(val, yaml.ScalarNode) and val.tag in (_STR, _INT, _BOOL):
                    env[var] = val.value
                else:
                    self.problem(val, f"{where}.env.{var}", "a string value")
            found[name] = Environment(
                name=name, tests=tests, install=install,
                uninstall=self.optional(fields, "uninstall", lambda n: self.strings(n, f"{where}.uninstall"), ()),
                env=env,
                ci=bool(self.optional(fields, "ci", lambda n: self.boolean(n, f"{where}.ci"), False)),
                description=self.optional(fields, "description", lambda n: self.string(n, f"{where}.description") or "", ""),
                position=self.at(key),
            )
        return found

    def patches(self, node: yaml.Node) -> dict[str, dict[str, tuple[VersionRecord, ...]]]:
        found: dict[str, dict[str, tuple[VersionRecord, ...]]] = {}
        for patch_id, (key, value) in self.mapping(node, "patches", "a mapping of patch ids").items():
            if not _PATCH_ID.match(patch_id):
                self.problem(key, f"patches.{patch_id}", "a patch id like 'upstream.name'", repr(patch_id))
            variants = {}
            for variant, (_, records) in self.mapping(value, f"patches.{patch_id}", "a mapping of variant names").items():
                where = f"patches.{patch_id}.{variant}"
                items = self.sequence(records, where, "a list of version records")
                variants[variant] = tuple(
                    record for i, item in enumerate(items) if (record := self.record(item, f"{where}[{i}]")) is not None
                )
            found[patch_id] = variants
        return found

    def record(self, node: yaml.Node, where: str) -> VersionRecord | None:
        fields = self.mapping(node, where, "a version record (a mapping with 'versions' and 'status')")
        if not fields:
            return None
        before = len(self.problems)
        self.keys(fields, where, ("versions", "status"), ("verified_by", "targets", "note"), node)
        versions = self.optional(fields, "versions", lambda n: self.versions(n, f"{where}.versions"), {})
        status = self.optional(fields, "status", lambda n: self.string(n, f"{where}.status", f"one of {', '.join(STATUSES)}"), None)
        if status is not None and status not in STATUSES:
            self.problem(fields["status"][1], f"{where}.status", f"one of {', '.join(STATUSES)}")
        verified_by = self.optional(fields, "verified_by", lambda n: self.strings(n, f"{where}.verified_by"), ())
        for i, source in enumerate(verified_by):
            if not _VERIFIED_BY.match(source):
                self.problem(fields["verified_by"][1].value[i], f"{where}.verified_by[{i}]",
                             "'static' or 'tests:<environment>'")
        targets = self.optional(fields, "targets", lambda n: self.targets(n, f"{where}.targets"), {})
        note = self.optional(fields, "note", lambda n: self.string(n, f"{where}.note") or "", "")
        if len(self.problems) > before or status is None:
            return None
        return VersionRecord(versions, status, verified_by, targets, note, self.at(node))

    def versions(self, node: yaml.Node, where: str) -> dict[str, str]:
        from packaging.version import InvalidVersion, Version

        found = {}
        fields = self.mapping(node, where, "a mapping of distribution names to versions")
        if isinstance(node, yaml.MappingNode) and not fields and not node.value:
            self.problem(node, where, "at least one distribution", "an empty mapping")
        for dist, (_, value) in fields.items():
            if isinstance(value, yaml.ScalarNode) and value.tag == "tag:yaml.org,2002:float":
                self.problem(value, f"{where}.{dist}", f"a quoted version string (write '{value.value}': YAML reads "
                             "an unquoted 0.20 as the number 0.2)")
                continue
            version = self.string(value, f"{where}.{dist}", "a version string")
            if version is None:
                continue
            try:
                Version(version)
            except InvalidVersion:
                self.problem(value, f"{where}.{dist}", "a PEP 440 version", repr(version))
                continue
            found[dist] = version
        return found

    def targets(self, node: yaml.Node, where: str) -> dict[str, TargetRecord]:
        found = {}
        for target, (key, value) in self.mapping(node, where, "a mapping of targets").items():
            try:
                Target.parse(target)
            except DeclarationError:
                self.problem(key, f"{where}", "a target 'package.module:Qualname.attr'", repr(target))
                continue
            fields = self.mapping(value, f"{where}.{target}", "a mapping with 'fingerprint' and/or 'signature'")
            self.keys(fields, f"{where}.{target}", (), ("fingerprint", "signature"), value)
            fingerprint = self.optional(fields, "fingerprint", lambda n: self.string(n, f"{where}.{target}.fingerprint"), None)
            if fingerprint is not None and not _FINGERPRINT.match(fingerprint):
                self.problem(fields["fingerprint"][1], f"{where}.{target}.fingerprint", "16 lowercase hex digits")
            signature = self.optional(fields, "signature", lambda n: self.string(n, f"{where}.{target}.signature"), None)
            found[target] = TargetRecord(fingerprint, signature)
        return found


def parse(text: str, path: str = "compat_matrix.yaml") -> Matrix:
    """Validate ``text`` as a matrix; raise ``MatrixError`` listing every problem with its position."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        root = yaml.compose(text, Loader=loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position(path, mark.line + 1, mark.column + 1) if mark else Position(path, 1, 1)
        raise MatrixError(path, [Problem(position, "YAML syntax", "well-formed YAML", str(exc.problem))]) from None
    reader = _Reader(path)
    matrix = reader.document(root)
    if reader.problems:
        raise MatrixError(path, sorted(reader.problems, key=lambda p: (p.position.line, p.position.column)))
    return matrix
