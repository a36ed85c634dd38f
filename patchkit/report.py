"""Rendering statuses and declarations for people; the data itself lives in :mod:`patchkit.runtime.status`."""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from .runtime.declaration import Call, Patch
from .runtime.status import PatchStatus

#: Columns a line of a human report may take: a terminal, a CI log, a pasted issue.
WIDTH = 100
#: What marks text cut short to fit; ``--verbose``/``--json`` show the whole of it.
CUT = "..."


def fit(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns (cut short with ``...`` if longer)."""
    return text if len(text) <= width else text[:max(width - len(CUT), 0)] + CUT


def lines_within(line: str, more: str, width: int = WIDTH, full: bool = False) -> list[str]:
    """``line`` followed by ``more`` (a reason, a message) on the same line if it fits; else ``more``
    on an indented line below, cut to ``width`` (``full``: wrapped over as many lines as it takes)."""
    more = " ".join(more.split())
    if not more:
        return [fit(line.rstrip(), width)]
    joined = f"{line}  {more}"
    if len(joined) <= width:
        return [joined]
    if not full:
        return [fit(line.rstrip(), width), "    " + fit(more, width - 4)]
    import textwrap

    return [fit(line.rstrip(), width)] + textwrap.wrap(more, width, initial_indent="    ", subsequent_indent="    ",
                                                       break_on_hyphens=False, break_long_words=True)


def _why(record: PatchStatus) -> str:
    why = record.error or record.detail or (record.reason.value if record.reason else "")
    return why + (f" (variant {record.variant})" if record.variant else "")


def status_table(records: Iterable[PatchStatus], width: int = WIDTH, full: bool = False,
                 notes: Mapping[str, str] | None = None) -> str:
    """One line per patch, at most ``width`` columns (``full``: long reasons wrapped below instead of
    cut). ``notes`` replaces the reason of some patches (a patch blocked by the environment)."""
    records = list(records)
    notes = notes or {}
    rows = [(r.id, r.state.value + (f" ({r.reason.value})" if r.reason else ""), notes.get(r.id) or _why(r))
            for r in records]
    widths = [max([len(row[i]) for row in rows] + [len(("PATCH", "STATE")[i])]) for i in range(2)]
    lines = [f"{'PATCH':<{widths[0]}}  {'STATE':<{widths[1]}}  WHY"]
    for patch_id, state, why in rows:
        lines += lines_within(f"{patch_id:<{widths[0]}}  {state:<{widths[1]}}", why, width, full)
    return "\n".join(lines)


def markdown_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|") or " "


def status_markdown(records: Iterable[PatchStatus], stack_lines: Iterable[str] = (),
                    notes: Mapping[str, str] | None = None) -> str:
    """A pasteable report: the stack, then one table row per patch, nothing cut short."""
    notes = notes or {}
    out = ["### patchkit status", ""] + [f"    {line}" for line in stack_lines] + [""]
    out += ["| patch | state | variant | why |", "|---|---|---|---|"]
    for r in records:
        state = r.state.value + (f" ({r.reason.value})" if r.reason else "")
        why = notes.get(r.id) or r.error or r.detail or ""
        out.append(f"| `{r.id}` | {markdown_cell(state)} | {markdown_cell(r.variant or '-')} | {markdown_cell(why)} |")
    return "\n".join(out)


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
    return "\n".join(wrapped for line in lines for wrapped in _wrap(line))


def _wrap(line: str, width: int = WIDTH) -> list[str]:
    """A line of prose within ``width`` columns, its continuation indented under its text."""
    if len(line) <= width:
        return [line]
    import textwrap

    indent = " " * (len(line) - len(line.lstrip()) + 2)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False)


def patch_dict(patch: Patch) -> dict[str, Any]:
    """A declaration as JSON-ready data (``patchkit list --json``, ``patchkit explain --json``)."""
    return {
        "id": patch.id, "opt_in": patch.opt_in, "summary": patch.summary, "why": patch.why,
        "upstream": patch.upstream, "removal": patch.removal, "distributions": list(patch.distributions),
        "variants": [{
            "name": variant.name, "requires": dict(variant.requires), "native": variant.native,
            "installs": [{"kind": type(action).__name__.lower(),
                          "where": action.after if isinstance(action, Call) else action.target}
                         for action in variant.installs],
        } for variant in patch.variants],
    }
