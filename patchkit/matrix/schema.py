"""Reading ``compat_matrix.yaml``: its YAML nodes checked against the schema, with file positions.

The file is composed into YAML nodes (:func:`compose`, iteratively from the parser's events, with
a depth limit), not loaded, so every value keeps the line and column it came from; each problem
names that position, the path to the value, what was expected and what
was found. Every problem in the file is reported at once, not just the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

from ..runtime.declaration import Target
from ..runtime.errors import DeclarationError, PatchkitError
from .model import DEFAULT_PYTHON, STATUSES, Environment, Matrix, Position, TargetRecord, VersionRecord

SCHEMA_VERSION = 1

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_BOOL = "tag:yaml.org,2002:bool"
_FLOAT = "tag:yaml.org,2002:float"
#: A plain decimal integer. YAML 1.1 (PyYAML) also reads 0x1, 0b1, 0o1, 1_0 and 1:00 (base 60) as
#: integers, which int() refuses: they are reported, never converted.
_DECIMAL = re.compile(r"[-+]?[0-9]+", re.ASCII)
_ENV_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
_PYTHON = re.compile(r"^3\.[0-9]{1,2}$")
_VERIFIED_BY = re.compile(r"^(static|(tests|doctor):[a-z0-9][a-z0-9._-]*)$")
_PATCH_ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
_TAG_NAMES = {_STR: "a string", _INT: "an integer", _BOOL: "a boolean", _FLOAT: "a number",
              "tag:yaml.org,2002:null": "nothing (null)"}

T = TypeVar("T")
#: A mapping's string keys, each with its key node (for positions) and its value node.
Fields = dict[str, tuple[yaml.Node, yaml.Node]]


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

    def mapping(self, node: yaml.Node, where: str, expected: str = "a mapping") -> Fields:
        """Keys (strings) to (key node, value node); duplicate and non-string keys are problems."""
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, where, expected)
            return {}
        found: Fields = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag != _STR:
                self.problem(key, where, "string keys", _describe(key))
                continue
            if key.value in found:
                first = self.at(found[key.value][0])
                self.problem(key, f"{where}.{key.value}", f"each key once (first at line {first.line})",
                             "a duplicate key")
                continue
            found[key.value] = (key, value)
        return found

    def keys(self, fields: Fields, where: str, required: tuple[str, ...], optional: tuple[str, ...],
             node: yaml.Node) -> None:
        for name in required:
            if name not in fields:
                self.problem(node, where, f"a key {name!r}", f"keys {sorted(fields)}" if fields else "no keys")
        for name, (key, _) in fields.items():
            if name not in required + optional:
                self.problem(key, f"{where}.{name}", f"one of {', '.join(required + optional)}",
                             f"unknown key {name!r}")

    def string(self, node: yaml.Node, where: str, expected: str = "a string") -> str | None:
        if isinstance(node, yaml.ScalarNode) and node.tag == _STR:
            return str(node.value)
        self.problem(node, where, expected)
        return None

    def text(self, node: yaml.Node, where: str) -> str:
        return self.string(node, where) or ""

    def python_version(self, node: yaml.Node, where: str) -> str:
        if isinstance(node, yaml.ScalarNode) and node.tag == _STR and _PYTHON.match(node.value):
            return str(node.value)
        found = repr(node.value) if isinstance(node, yaml.ScalarNode) else None
        self.problem(node, where, 'a quoted Python version such as "3.12"', found)
        return ""

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

    def optional(self, fields: Fields, name: str, where: str, read: Callable[[yaml.Node, str], T]) -> T | None:
        """``read(value, "<where>.<name>")`` if the key is there, else None."""
        return read(fields[name][1], f"{where}.{name}") if name in fields else None

    # -- the schema -------------------------------------------------------------------------------

    def document(self, root: yaml.Node | None) -> Matrix:
        expected = "a mapping with 'schema' and 'environments'"
        if root is None:
            self.problems.append(Problem(Position(self.path, 1, 1), "the file", expected, "an empty document"))
            return Matrix(Path(self.path), SCHEMA_VERSION, {}, {})
        fields = self.mapping(root, "the file", expected)
        self.keys(fields, "the file", ("schema", "environments"), ("patches",), root)
        if "schema" in fields:
            node = fields["schema"][1]
            if not (isinstance(node, yaml.ScalarNode) and node.tag == _INT and _DECIMAL.fullmatch(node.value)
                    and int(node.value) == SCHEMA_VERSION):
                self.problem(node, "schema", f"{SCHEMA_VERSION} (the schema version this patchkit reads, written "
                             "in decimal)")
        environments = self.optional(fields, "environments", "", self.environments) or {}
        patches = self.optional(fields, "patches", "", self.patches) or {}
        positions = {name: self.at(key) for name, (key, _) in fields.items()}
        return Matrix(Path(self.path), SCHEMA_VERSION, environments, patches, positions)

    def environments(self, node: yaml.Node, where: str) -> dict[str, Environment]:
        found = {}
        for name, (key, value) in self.mapping(node, "environments", "a mapping of environment names").items():
            here = f"environments.{name}"
            if not _ENV_NAME.match(name):
                self.problem(key, here, "an environment name of lowercase letters, digits, '.', '_' or '-'",
                             repr(name))
            fields = self.mapping(value, here)
            self.keys(fields, here, ("install", "tests"), ("uninstall", "env", "ci", "description", "python"), value)
            found[name] = Environment(
                name=name,
                tests=self.optional(fields, "tests", here, self.test_paths) or (),
                install=self.optional(fields, "install", here, self.install_steps) or (),
                uninstall=self.optional(fields, "uninstall", here, self.strings) or (),
                env=self.optional(fields, "env", here, self.variables) or {},
                ci=bool(self.optional(fields, "ci", here, self.boolean)),
                description=self.optional(fields, "description", here, self.text) or "",
                python=self.optional(fields, "python", here, self.python_version) or DEFAULT_PYTHON,
                position=self.at(key),
            )
        return found

    def install_steps(self, node: yaml.Node, where: str) -> tuple[tuple[str, ...], ...]:
        steps = self.sequence(node, where, "a list of pip-argument lists")
        return tuple(self.strings(step, f"{where}[{i}]", "a list of pip arguments") for i, step in enumerate(steps))

    def test_paths(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        paths = self.strings(node, where, "a list of test paths")
        if isinstance(node, yaml.SequenceNode) and not node.value:
            self.problem(node, where, "at least one test path", "an empty list")
        return paths

    def variables(self, node: yaml.Node, where: str) -> dict[str, str]:
        found = {}
        for name, (_, value) in self.mapping(node, where).items():
            if isinstance(value, yaml.ScalarNode) and value.tag in (_STR, _INT, _BOOL):
                found[name] = str(value.value)
            else:
                self.problem(value, f"{where}.{name}", "a string value")
        return found

    def patches(self, node: yaml.Node, where: str) -> dict[str, dict[str, tuple[VersionRecord, ...]]]:
        found: dict[str, dict[str, tuple[VersionRecord, ...]]] = {}
        for patch_id, (key, value) in self.mapping(node, "patches", "a mapping of patch ids").items():
            if not _PATCH_ID.match(patch_id):
                self.problem(key, f"patches.{patch_id}", "a patch id like 'upstream.name'", repr(patch_id))
            variants = {}
            named = self.mapping(value, f"patches.{patch_id}", "a mapping of variant names")
            for variant, (_, records) in named.items():
                here = f"patches.{patch_id}.{variant}"
                items = self.sequence(records, here, "a list of version records")
                variants[variant] = tuple(
                    record for i, item in enumerate(items) if (record := self.record(item, f"{here}[{i}]")) is not None
                )
            found[patch_id] = variants
        return found

    def record(self, node: yaml.Node, where: str) -> VersionRecord | None:
        fields = self.mapping(node, where, "a version record (a mapping with 'versions' and 'status')")
        if not fields:
            return None
        before = len(self.problems)
        self.keys(fields, where, ("versions", "status"), ("verified_by", "targets", "note"), node)
        versions = self.optional(fields, "versions", where, self.versions) or {}
        status = self.optional(fields, "status", where, self.status)
        verified_by = self.optional(fields, "verified_by", where, self.sources) or ()
        targets = self.optional(fields, "targets", where, self.targets) or {}
        note = self.optional(fields, "note", where, self.string) or ""
        if len(self.problems) > before or status is None:
            return None
        return VersionRecord(versions, status, verified_by, targets, note, self.at(node))

    def status(self, node: yaml.Node, where: str) -> str | None:
        expected = f"one of {', '.join(STATUSES)}"
        found = self.string(node, where, expected)
        if found is not None and found not in STATUSES:
            self.problem(node, where, expected)
            return None
        return found

    def sources(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        found = self.strings(node, where)
        for i, source in enumerate(found):
            if not _VERIFIED_BY.match(source):
                self.problem(node.value[i], f"{where}[{i}]", "'static', 'tests:<environment>' or 'doctor:<host>'")
        return found

    def versions(self, node: yaml.Node, where: str) -> dict[str, str]:
        from packaging.version import InvalidVersion, Version

        found = {}
        fields = self.mapping(node, where, "a mapping of distribution names to versions")
        if isinstance(node, yaml.MappingNode) and not node.value:
            self.problem(node, where, "at least one distribution", "an empty mapping")
        for dist, (_, value) in fields.items():
            if isinstance(value, yaml.ScalarNode) and value.tag == _FLOAT:
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
                self.problem(key, where, "a target 'package.module:Qualname.attr'", repr(target))
                continue
            here = f"{where}.{target}"
            fields = self.mapping(value, here, "a mapping with 'fingerprint' and/or 'signature'")
            self.keys(fields, here, (), ("fingerprint", "signature"), value)
            fingerprint = self.optional(fields, "fingerprint", here, self.fingerprint)
            signature = self.optional(fields, "signature", here, self.string)
            found[target] = TargetRecord(fingerprint, signature)
        return found

    def fingerprint(self, node: yaml.Node, where: str) -> str | None:
        found = self.string(node, where, "16 lowercase hex digits")
        if found is not None and not _FINGERPRINT.match(found):
            self.problem(node, where, "16 lowercase hex digits")
            return None
        return found


#: Deeper nesting than any matrix needs (it uses 7 levels). PyYAML composes nodes recursively: a
#: 100 kB file of 50,000 nested lists crashes the interpreter (C composer) or raises RecursionError.
MAX_DEPTH = 64


def compose(text: str, path: str = "compat_matrix.yaml", max_depth: int = MAX_DEPTH) -> yaml.Node | None:
    """The node tree of ``text``'s single document, built from the parser's events without recursion.

    Nesting deeper than ``max_depth`` is refused at the event that opens it, before anything that
    deep is composed. YAML errors become ``MatrixError`` with the file, line and column.

    libyaml (PyYAML's C loader) has limits of its own that it may meet first: PyYAML 6.0.4 stops at
    1,000 nested flow collections while *scanning ahead*, before the first event reaches the depth
    check. So an error from the C loader is not reported as it is: the text is composed again with
    PyYAML's pure-Python loader, which reads event by event, and the error the user gets (patchkit's
    depth limit, or a syntax error with its position) does not depend on how PyYAML was built.
    """
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return _compose_with(fast, text, path, max_depth)
        except yaml.YAMLError:
            pass
    try:
        return _compose_with(yaml.SafeLoader, text, path, max_depth)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position(path, mark.line + 1, mark.column + 1) if mark else Position(path, 1, 1)
        raise MatrixError(path, [Problem(position, "YAML syntax", "well-formed YAML", str(exc.problem))]) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow; its offset in the text
        before = text[:exc.position]
        position = Position(path, before.count("\n") + 1, len(before) - before.rfind("\n"))
        raise MatrixError(path, [Problem(position, "the file", "printable characters",
                                         f"character {exc.character!r}")]) from None
    except yaml.YAMLError as exc:  # an error without a position
        raise MatrixError(path, [Problem(Position(path, 1, 1), "YAML syntax", "well-formed YAML", str(exc))]) from None


def _compose_with(loader_class: Any, text: str, path: str, max_depth: int) -> yaml.Node | None:
    loader = loader_class(text)
    try:
        return _compose_events(loader, path, max_depth)
    finally:
        loader.dispose()


def _compose_events(loader: Any, path: str, max_depth: int) -> yaml.Node | None:
    events = yaml.events
    loader.get_event()  # StreamStart
    if loader.check_event(events.StreamEndEvent):
        return None
    loader.get_event()  # DocumentStart
    anchors: dict[str, yaml.Node] = {}
    #: Open collections: the node and, for a mapping, the key waiting for its value.
    stack: list[list[Any]] = []
    root: yaml.Node | None = None
    while not loader.check_event(events.DocumentEndEvent):
        event: Any = loader.get_event()
        start: Any = event.start_mark
        end: Any = event.end_mark
        node: Any
        if isinstance(event, events.AliasEvent):
            if event.anchor not in anchors:
                raise yaml.composer.ComposerError(None, None, f"found undefined alias {event.anchor!r}",
                                                  start)
            node = anchors[event.anchor]
        elif isinstance(event, events.ScalarEvent):
            tag = event.tag
            if tag is None or tag == "!":
                tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
            node = yaml.ScalarNode(tag, event.value, start, end, style=event.style)
        elif isinstance(event, (events.SequenceStartEvent, events.MappingStartEvent)):
            if len(stack) >= max_depth:
                raise MatrixError(path, [Problem(Position(path, start.line + 1,
                                                          start.column + 1),
                                                 "the file", f"at most {max_depth} nested lists or mappings",
                                                 "deeper nesting")])
            kind = yaml.SequenceNode if isinstance(event, events.SequenceStartEvent) else yaml.MappingNode
            tag = event.tag
            if tag is None or tag == "!":
                tag = loader.resolve(kind, None, event.implicit)
            collection = kind(tag, [], start, None, flow_style=event.flow_style)
            if event.anchor is not None:
                anchors[event.anchor] = collection
            stack.append([collection, None])
            continue
        else:  # SequenceEnd / MappingEnd
            node = stack.pop()[0]
            node.end_mark = end
        if isinstance(event, events.ScalarEvent) and event.anchor is not None:
            anchors[event.anchor] = node
        if not stack:
            root = node
            continue
        parent = stack[-1]
        if isinstance(parent[0], yaml.SequenceNode):
            parent[0].value.append(node)
        elif parent[1] is None:
            parent[1] = node
        else:
            parent[0].value.append((parent[1], node))
            parent[1] = None
    loader.get_event()  # DocumentEnd
    if not loader.check_event(events.StreamEndEvent):
        event = loader.get_event()
        extra: Any = event.start_mark
        raise yaml.composer.ComposerError("expected a single document in the stream", None,
                                          "but found another document", extra)
    return root


def parse(text: str, path: str = "compat_matrix.yaml") -> Matrix:
    """Validate ``text`` as a matrix; raise ``MatrixError`` listing every problem with its position."""
    root = compose(text, path)
    reader = _Reader(path)
    matrix = reader.document(root)
    if reader.problems:
        raise MatrixError(path, sorted(reader.problems, key=lambda p: (p.position.line, p.position.column)))
    return matrix
