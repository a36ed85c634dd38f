"""``patchkit matrix static``: upstream releases checked from their artifacts, never installed.

Two uses:

* :func:`verify_matrix`: every version record in the matrix, for every ``Replace``/``Wrap``
  target of its variant: the symbol is present, its fingerprint and signature are the recorded
  ones; every ``Add`` target is absent (``Add`` creates what upstream lacks). With ``record``,
  missing fingerprints/signatures are filled in and ``static`` is added to ``verified_by``.
* :func:`survey`: a list of symbols over a list of releases, with what changed from one release
  to the next (new, signature, annotations only, formatting/docstring only, code), as facts.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..runtime.catalogue import Registered
from ..runtime.declaration import Add, Replace, Target, Wrap
from .artifacts import DEFAULT_CACHE, ArtifactSpec, SourceTree, fetch
from .model import IN_RANGE, VERIFIED, Matrix, TargetRecord, VersionRecord
from .symbols import ABSENT, SymbolFacts, inspect_target

logger = logging.getLogger(__name__)

NEW = "new"
SIG_CHANGED = "sig changed"
ANNOTATIONS_ONLY = "sig changed (annotations only)"
FORMAT_ONLY = "≈"  #: the text changed, the docstring-free syntax tree did not
CODE_CHANGED = "changed"


@dataclass(frozen=True)
class Observation:
    """One symbol in one release, and how it differs from the release before it in the survey."""

    distribution: str
    version: str
    symbol: str
    facts: SymbolFacts
    change: str = ""


def facts_in(tree: SourceTree, target: Target) -> SymbolFacts:
    return inspect_target(tree.module_file, target)


def change_between(before: SymbolFacts | None, after: SymbolFacts) -> str:
    """The drift report's markers: what moved between two releases of one symbol."""
    if after.status == ABSENT or before is None:
        return ""
    if before.status == ABSENT:
        return NEW
    if before.call_signature != after.call_signature:
        return SIG_CHANGED
    if before.signature != after.signature:
        return ANNOTATIONS_ONLY
    if before.fingerprint == after.fingerprint:
        return FORMAT_ONLY if before.text_hash != after.text_hash else ""
    return CODE_CHANGED


def survey(distribution: str, versions: Sequence[str], symbols: Sequence[str], cache: Path = DEFAULT_CACHE,
           spec: ArtifactSpec | None = None) -> list[Observation]:
    """Every symbol in every release of ``distribution``, in the order given."""
    spec = spec or ArtifactSpec(distribution)
    targets = [Target.parse(symbol) for symbol in symbols]
    previous: dict[str, SymbolFacts] = {}
    found = []
    for version in versions:
        tree = fetch(spec, version, cache)
        for symbol, target in zip(symbols, targets, strict=True):
            facts = facts_in(tree, target)
            found.append(Observation(distribution, version, symbol, facts, change_between(previous.get(symbol), facts)))
            previous[symbol] = facts
    return found


@dataclass(frozen=True)
class Finding:
    """A disagreement between a version record and the release artifact, or a confirmation."""

    patch_id: str
    variant: str
    versions: str
    target: str
    ok: bool
    message: str


def _tree_for(target: Target, trees: Mapping[str, SourceTree]) -> SourceTree | None:
    for tree in trees.values():
        if tree.module_file(target.module) is not None:
            return tree
    return None


def _added_by_others(patches: Sequence[Registered], patch_id: str, versions: Mapping[str, str]) -> dict[str, str]:
    """Attributes other patches ``Add`` on these versions (target -> patch id): not upstream's code."""
    from .check import covers

    return {action.target: registered.patch.id for registered in patches if registered.patch.id != patch_id
            for variant in registered.patch.variants if covers(variant, versions)
            for action in variant.installs if isinstance(action, Add)}


def _check_record(patch_id: str, variant_name: str, actions: Iterable[object], record: VersionRecord,
                  trees: Mapping[str, SourceTree],
                  added: Mapping[str, str] | None = None) -> tuple[list[Finding], dict[str, TargetRecord]]:
    shown = ", ".join(f"{d} {v}" for d, v in sorted(record.versions.items()))
    findings: list[Finding] = []
    measured: dict[str, TargetRecord] = {}

    def note(target: str, ok: bool, message: str) -> None:
        findings.append(Finding(patch_id, variant_name, shown, target, ok, message))

    for action in actions:
        if not isinstance(action, (Replace, Wrap, Add)):
            continue
        target = Target.parse(action.target)
        tree = _tree_for(target, trees)
        facts = facts_in(tree, target) if tree is not None else SymbolFacts(ABSENT)
        if isinstance(action, Add):
            note(action.target, facts.status == ABSENT,
                 "absent, as Add expects" if facts.status == ABSENT
                 else f"already defined ({facts.defined_at}): Add would fail")
            continue
        creator = next((f"{pid} (Add {t})" for t, pid in (added or {}).items()
                        if action.target == t or action.target.startswith(t + ".")), None)
        if facts.status == ABSENT and creator is not None:
            note(action.target, True, f"not upstream's: created at run time by {creator}")
            continue
        if facts.status == ABSENT:
            note(action.target, False, f"absent from {', '.join(t.artifact for t in trees.values())}")
            continue
        recorded = record.targets.get(action.target, TargetRecord())
        measured[action.target] = TargetRecord(facts.fingerprint, facts.signature)
        problems = []
        if recorded.signature is not None and recorded.signature != facts.signature:
            problems.append(f"signature {facts.signature} differs from the recorded {recorded.signature}")
        if recorded.fingerprint is not None and recorded.fingerprint != facts.fingerprint:
            problems.append(f"fingerprint {facts.fingerprint} differs from the recorded {recorded.fingerprint}")
        note(action.target, not problems, "; ".join(problems) or f"present ({facts.defined_at}), fingerprint "
             f"{facts.fingerprint}" + ("" if recorded.fingerprint else " (none recorded yet)"))
    return findings, measured


def verify_matrix(matrix: Matrix, patches: Sequence[Registered], cache: Path = DEFAULT_CACHE,
                  record: bool = False, add: Sequence[tuple[str, str]] = ()) -> tuple[list[Finding], Matrix]:
    """Check every in-range record of every registered variant against its release artifacts.

    ``add`` names more releases (distribution, version): each becomes a candidate record of every
    installing variant that requires only that distribution and whose range holds it. Returns the
    findings and the matrix, updated when ``record`` is set: checked records get what they lacked
    and ``static`` in ``verified_by``; checked candidates are added.
    """
    from .check import covers

    findings: list[Finding] = []
    updated = {pid: dict(variants) for pid, variants in matrix.patches.items()}
    for registered in patches:
        patch = registered.patch
        for variant in patch.variants:
            if variant.native is not None:
                continue  # nothing installs: nothing to find in an artifact
            existing = list(matrix.records(patch.id, variant.name))
            known = {r.key() for r in existing}
            candidates = [VersionRecord({dist: version}, VERIFIED, ()) for dist, version in add
                          if set(variant.requires) == {dist} and covers(variant, {dist: version})
                          and ((dist, version),) not in known]
            kept = []
            for rec in existing + candidates:
                if rec.status not in IN_RANGE:
                    kept.append(rec)
                    continue
                trees = {dist: fetch(ArtifactSpec(dist), version, cache) for dist, version in rec.versions.items()}
                added = _added_by_others(patches, patch.id, rec.versions)
                found, measured = _check_record(patch.id, variant.name, variant.installs, rec, trees, added)
                findings += found
                if record and all(f.ok for f in found):
                    targets = {t: TargetRecord(rec.targets.get(t, TargetRecord()).fingerprint or m.fingerprint,
                                               rec.targets.get(t, TargetRecord()).signature or m.signature)
                               for t, m in measured.items()}
                    rec = dataclasses.replace(rec, targets=targets,
                                              verified_by=tuple(sorted(set(rec.verified_by) | {"static"})))
                elif rec in candidates:
                    continue  # a candidate that did not check out is reported, not recorded
                kept.append(rec)
            if kept:
                updated.setdefault(patch.id, {})[variant.name] = tuple(kept)
    return findings, dataclasses.replace(matrix, patches=updated)


def refingerprint(matrix: Matrix, cache: Path = DEFAULT_CACHE) -> tuple[list[Finding], Matrix]:
    """Every recorded fingerprint recomputed from its release artifact with today's fingerprint function.

    For a change of the fingerprint format (:data:`patchkit.runtime.fingerprint.FORMAT`), not of
    upstream code: only targets that already have a fingerprint are touched, records gain no new
    targets and no ``verified_by`` source. A target is refingerprinted only if the artifact still has
    it with the recorded signature; anything else is a failed finding and the record is left as is.
    """
    findings: list[Finding] = []
    updated: dict[str, dict[str, tuple[VersionRecord, ...]]] = {}
    for patch_id, variants in matrix.patches.items():
        updated[patch_id] = {}
        for variant_name, records in variants.items():
            kept = []
            for rec in records:
                stale = {t: r for t, r in rec.targets.items() if r.fingerprint is not None}
                if not stale:
                    kept.append(rec)
                    continue
                shown = ", ".join(f"{d} {v}" for d, v in sorted(rec.versions.items()))
                trees = {dist: fetch(ArtifactSpec(dist), version, cache) for dist, version in rec.versions.items()}
                targets = dict(rec.targets)
                for name, old in stale.items():
                    target = Target.parse(name)
                    tree = _tree_for(target, trees)
                    facts = facts_in(tree, target) if tree is not None else SymbolFacts(ABSENT)
                    if facts.status == ABSENT or (old.signature is not None and old.signature != facts.signature):
                        problem = ("absent from the artifact" if facts.status == ABSENT
                                   else f"signature {facts.signature} differs from the recorded {old.signature}")
                        findings.append(Finding(patch_id, variant_name, shown, name, False, problem))
                        continue
                    targets[name] = TargetRecord(facts.fingerprint, old.signature)
                    findings.append(Finding(patch_id, variant_name, shown, name, True,
                                            f"fingerprint {old.fingerprint} -> {facts.fingerprint}"))
                kept.append(dataclasses.replace(rec, targets=targets))
            updated[patch_id][variant_name] = tuple(kept)
    return findings, dataclasses.replace(matrix, patches=updated)
