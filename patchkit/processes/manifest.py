"""A process's manifest: which patches it has, in which variant, against which upstream versions.

Manifests are what the consistency check compares across the processes of a job. Each entry
carries the fields that must agree between processes (:data:`COMPARED_FIELDS`) and, for people,
the detail and error of its status. ``fingerprints`` is the extension point for per-target
identities (e.g. a hash of the installed replacement's code): empty until the engine exposes them;
anything put there is compared like the other fields.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ..runtime.errors import PatchkitError
from ..runtime.status import PatchStatus

SCHEMA = 1

#: The entry fields that must agree between processes for them to count as patched alike.
COMPARED_FIELDS = ("state", "reason", "variant", "versions", "fingerprints")

#: Extension point: functions returning ``{fingerprint name: value}`` for one status record, e.g.
#: a hash of what is installed at each target. Registered ones fill ``Entry.fingerprints``.
FINGERPRINTERS: list[Callable[[PatchStatus], Mapping[str, str]]] = []


class ManifestError(PatchkitError, ValueError):
    """A manifest file cannot be read: not JSON, not a manifest, or of another schema. Names the file."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: not a readable patchkit manifest: {problem}")


def _imported(module: str) -> bool:
    found = sys.modules.get(module)
    return found is not None and not getattr(getattr(found, "__spec__", None), "_initializing", False)


@dataclass(frozen=True)
class Entry:
    """One patch as this process has it.

    ``imported_while_pending`` lists, for a ``pending`` patch, the modules it waits for that this
    process had imported when the manifest was collected: such a patch will not install by itself,
    so the consistency check never counts it as agreeing with ``applied``.
    """

    id: str
    state: str
    reason: str | None = None
    variant: str | None = None
    versions: Mapping[str, str | None] = field(default_factory=dict)
    fingerprints: Mapping[str, str] = field(default_factory=dict)
    detail: str = ""
    error: str | None = None
    imported_while_pending: tuple[str, ...] = ()

    @classmethod
    def from_status(cls, record: PatchStatus) -> "Entry":
        fingerprints: dict[str, str] = {}
        for fingerprinter in FINGERPRINTERS:
            fingerprints.update(fingerprinter(record))
        waiting = getattr(record, "waiting_for", ())
        imported = tuple(m for m in waiting if _imported(m)) if record.state.value == "pending" else ()
        return cls(id=record.id, state=record.state.value, reason=record.reason.value if record.reason else None,
                   variant=record.variant, versions=dict(record.versions), fingerprints=fingerprints,
                   detail=record.detail, error=record.error, imported_while_pending=imported)

    def compared(self) -> dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in COMPARED_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, **self.compared(), "detail": self.detail, "error": self.error,
                "imported_while_pending": list(self.imported_while_pending)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Entry":
        return cls(id=data["id"], state=data["state"], reason=data.get("reason"), variant=data.get("variant"),
                   versions=dict(data.get("versions") or {}), fingerprints=dict(data.get("fingerprints") or {}),
                   detail=data.get("detail", ""), error=data.get("error"),
                   imported_while_pending=tuple(data.get("imported_while_pending") or ()))


@dataclass(frozen=True)
class Manifest:
    """The patches of one process, and enough about the process to find it again."""

    entries: tuple[Entry, ...]
    process: Mapping[str, Any] = field(default_factory=dict)
    #: What autoload did here (``patchkit.processes.autoload.Outcome.to_dict()``), None if not asked to run.
    autoload: Mapping[str, Any] | None = None

    @property
    def rank(self) -> int | None:
        return self.process.get("rank")

    def label(self) -> str:
        """How a report names this process: its given name, else its rank, else its host and pid."""
        if self.process.get("name"):
            return str(self.process["name"])
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"{self.process.get('host', '?')}:{self.process.get('pid', '?')}"

    def by_id(self) -> dict[str, Entry]:
        return {entry.id: entry for entry in self.entries}

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "process": dict(self.process), "autoload": self.autoload,
                "patches": [entry.to_dict() for entry in self.entries]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Manifest":
        if data.get("schema") != SCHEMA:
            raise ValueError(f"manifest schema {data.get('schema')!r} is not the supported {SCHEMA}")
        return cls(entries=tuple(Entry.from_dict(e) for e in data["patches"]), process=dict(data.get("process") or {}),
                   autoload=data.get("autoload"))

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write as JSON, atomically: a reader never sees half a manifest."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        os.replace(partial, target)
        return target

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> "Manifest":
        """Read a manifest file; ``ManifestError`` names the file and what is wrong with it."""
        shown = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ManifestError(shown, f"cannot read it ({exc})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            what = "empty" if not text.strip() else f"invalid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})"
            raise ManifestError(shown, f"{what}; a process writing it may have been killed") from None
        if not isinstance(data, dict):
            raise ManifestError(shown, f"expected a JSON object, found {type(data).__name__}")
        if data.get("schema") != SCHEMA:
            raise ManifestError(shown, f"schema {data.get('schema')!r} is not the supported {SCHEMA}")
        patches = data.get("patches")
        if not isinstance(patches, list) or not all(
                isinstance(e, dict) and isinstance(e.get("id"), str) and isinstance(e.get("state"), str)
                for e in patches):
            raise ManifestError(shown, "expected 'patches': a list of objects with 'id' and 'state'")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(shown, f"malformed entry ({exc!r})") from None


def collect(records: Iterable[PatchStatus] | None = None, *, rank: int | None = None) -> Manifest:
    """This process's manifest, from ``patchkit.status()`` unless ``records`` are given.

    ``rank`` defaults to the ``torch.distributed`` rank when a process group is initialised (torch
    already imported), else to the ``RANK`` environment variable launchers set, else None.
    """
    from ..runtime.process_engine import engine as default_engine
    from . import autoload

    outcome = autoload.outcome()
    if records is None:
        records = default_engine().status()
    entries = tuple(Entry.from_status(record) for record in records)
    return Manifest(entries=entries, process=_process(rank), autoload=outcome.to_dict() if outcome else None)


def _process(rank: int | None) -> dict[str, Any]:
    from .._version import __version__

    return {
        "rank": rank if rank is not None else _detected_rank(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "patchkit": __version__,
    }


def _detected_rank() -> int | None:
    distributed = sys.modules.get("torch.distributed")  # never import torch to find out
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank())
    raw = os.environ.get("RANK")
    return int(raw) if raw is not None and raw.strip().isdigit() else None


def _plain(value: Any) -> Any:
    return dict(sorted(value.items())) if isinstance(value, Mapping) else value
