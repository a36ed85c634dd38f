"""``patchkit matrix merge FILE``: fold another matrix document's records (a doctor run's) into this one.

A contributed record is refused, and nothing is merged (:class:`MergeError`, naming the record by
file and line), when the matrix would then fail ``patchkit matrix check``: a patch id that is not
registered, a variant the patch does not declare, versions outside the variant's range for a
``verified``/``native`` record (inside it for ``unsupported``/``known-bad``), a target the variant
does not patch, a ``tests:<env>`` source the matrix does not define.

A contributed record with the same versions as one already there must agree with it: same status,
and, for each target both recorded, the same fingerprint and signature. Then it adds its
``verified_by`` sources and fills in what the existing record lacks; the existing note is kept. A
record that contradicts one (another fingerprint for the same release: a modified install, or the
wrong record) is refused: the sources of a record vouch for every fingerprint in it, so neither
replacing the fingerprint under the existing sources nor adding the new source to the old
fingerprint would be honest. New records are added. Environments are never taken from a
contribution.

Linear in the number of records: each (patch, variant) is indexed by versions once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..runtime.catalogue import Registered
from ..runtime.errors import PatchkitError
from .check import _check_records, check
from .model import Matrix, TargetRecord, VersionRecord


class MergeError(PatchkitError, ValueError):
    """A contributed record cannot be merged; nothing was merged."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        listed = "\n  ".join(self.problems)
        super().__init__(f"{source}: {len(self.problems)} record(s) refused, nothing was merged:\n  {listed}")


def merge_contribution(matrix: Matrix, contribution: Matrix,
                       registry: Sequence[Registered] | None = None) -> Matrix:
    """``matrix`` with every record of ``contribution`` merged in; :class:`MergeError` if any is refused.

    With ``registry``, every contributed record is also checked against the registered patches as
    ``patchkit matrix check`` would check it, and the merged matrix may have no disagreement the
    original did not have.
    """
    problems: list[str] = []
    patches = {pid: {variant: list(records) for variant, records in variants.items()}
               for pid, variants in matrix.patches.items()}
    declared = {r.patch.id: r.patch for r in registry} if registry is not None else None
    for patch_id, variants in contribution.patches.items():
        for variant, records in variants.items():
            refused = _against_registry(matrix, declared, patch_id, variant, records) if declared is not None else []
            problems += refused
            if refused:
                continue
            existing = patches.setdefault(patch_id, {}).setdefault(variant, [])
            index = {record.key(): i for i, record in enumerate(existing)}
            for record in records:
                found = index.get(record.key())
                if found is None:
                    index[record.key()] = len(existing)
                    existing.append(dataclasses.replace(record, position=None))
                    continue
                combined, conflict = _combine(existing[found], record)
                if conflict:
                    problems.append(_named(record, patch_id, variant, conflict))
                else:
                    existing[found] = combined
    merged = dataclasses.replace(
        matrix, patches={pid: {v: tuple(rs) for v, rs in variants.items()} for pid, variants in patches.items()})
    if not problems and registry is not None:
        before = {str(d) for d in check(matrix, registry)}
        problems += [f"the merged matrix would fail `patchkit matrix check`: {d}"
                     for d in check(merged, registry) if str(d) not in before]
    if problems:
        raise MergeError(str(contribution.path), problems)
    return merged


def _named(record: VersionRecord, patch_id: str, variant: str, problem: str) -> str:
    shown = ", ".join(f"{d} {v}" for d, v in sorted(record.versions.items()))
    where = f"{record.position}: " if record.position else ""
    return f"{where}{patch_id} [{variant}] {shown}: {problem}"


def _against_registry(matrix: Matrix, declared: Mapping[str, object], patch_id: str, variant: str,
                      records: Sequence[VersionRecord]) -> list[str]:
    """Why ``matrix check`` would reject these contributed records (empty: it would not)."""
    from ..runtime.declaration import Patch

    patch = declared.get(patch_id)
    if not isinstance(patch, Patch):
        known = ", ".join(sorted(declared)) or "none"
        return [_named(r, patch_id, variant, f"no such patch is registered (known: {known})") for r in records]
    found = next((v for v in patch.variants if v.name == variant), None)
    if found is None:
        names = ", ".join(repr(v.name) for v in patch.variants)
        return [_named(r, patch_id, variant, f"the patch declares no such variant (it declares {names})")
                for r in records]
    return [str(disagreement) for disagreement in _check_records(matrix, patch_id, found, records)]


def _combine(old: VersionRecord, new: VersionRecord) -> tuple[VersionRecord, str]:
    """``old`` with ``new``'s sources and the target facts it lacks, or why they contradict."""
    if old.status != new.status:
        return old, f"status {new.status!r} contradicts the recorded {old.status!r} ({_sources(old)})"
    targets = dict(old.targets)
    for target, theirs in new.targets.items():
        ours = targets.get(target, TargetRecord())
        for field in ("fingerprint", "signature"):
            mine, other = getattr(ours, field), getattr(theirs, field)
            if mine is not None and other is not None and mine != other:
                return old, (f"{target}: {field} {other!r} contradicts the recorded {mine!r} ({_sources(old)});"
                             " the install measured is not the release recorded")
        targets[target] = TargetRecord(ours.fingerprint or theirs.fingerprint, ours.signature or theirs.signature)
    sources = tuple(sorted(set(old.verified_by) | set(new.verified_by)))
    return dataclasses.replace(old, verified_by=sources, targets=targets), ""


def _sources(record: VersionRecord) -> str:
    return "verified by " + ", ".join(record.verified_by) if record.verified_by else "no source"
