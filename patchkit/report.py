"""Rendering statuses and declarations for people; the data itself lives in :mod:`patchkit.runtime.status`."""

from __future__ import annotations

import json
from typing import Iterable

from .runtime.declaration import Call, Patch
from .runtime.status import PatchStatus


def status_table(records: Iterable[PatchStatus]) -> str:
    rows = [("PATCH", "STATE", "VARIANT", "WHY")]
    for record in records:
        why = record.error or record.detail or (record.reason.value if record.reason else "")
        state = record.state.value + (f" ({record.reason.value})" if record.reason else "")
        rows.append((record.id, state, record.variant or "-", why))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3]
             for row in rows)
    return "\n".join(lines)


def status_json(records: Iterable[PatchStatus]) -> str:
    return json.dumps([record.to_dict() for record in records], indent=2)


def describe(patch: Patch, verbose: bool = False) -> str:
    lines = [f"{patch.id}{'  (opt-in)' if patch.opt_in else ''}", f"  {patch.summary}"]
    if verbose:
        lines += [f"  why:      {patch.why}", f"  upstream: {patch.upstream}", f"  removal:  {patch.removal}"]
    for variant in patch.variants:
        if variant.native is not None:
            lines.append(f"  - {variant.name}: native upstream ({variant.native})")
            continue
        lines.append(f"  - {variant.name}:")
        for action in variant.installs:
            where = f"after import of {action.after}" if isinstance(action, Call) else action.target
            lines.append(f"      {type(action).__name__.lower():8} {where}")
    if not verbose:
        lines.append(f"  removal: {patch.removal}")
    return "\n".join(lines)
