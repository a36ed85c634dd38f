"""Compare `patchkit matrix static` with the upstream drift report, release by release.

    python tests/matrix/proof/compare_drift_report.py [--report PATH] [--cache DIR] [--symbols FILE]

Reads the symbol tables and the "Full signatures" lists of sections 1 and 2 of an upstream drift
report (``--report``; not in this repository: by default the project's research notes at
/work/shared/research/upstream-drift.md on the development machine), runs
:func:`patchkit.matrix.static.survey` over the same releases (downloaded once into the cache, not
installed), and compares, for every symbol and release: presence (present / absent / inherited from
which base), the source-text hash, the change marker against the previous release (new, sig
changed, annotations only, formatting only), and the full signature. Prints one line per
disagreement and a summary; exits 1 on any.
The first release of each range has no previous row here, so its change marker is not compared.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.version import Version

from patchkit.matrix.artifacts import DEFAULT_CACHE
from patchkit.matrix.static import ANNOTATIONS_ONLY, FORMAT_ONLY, NEW, SIG_CHANGED, Observation, survey
from patchkit.matrix.symbols import ABSENT, INHERITED, PRESENT

HERE = Path(__file__).parent
DEFAULT_REPORT = Path("/work/shared/research/upstream-drift.md")
SECTIONS = ("## 1. megatron-core", "## 2. vllm")
_CELL = re.compile(r"^(?:(?P<mark>✓|✗)|(?P<kind>inherited|replaced|moved|renamed):`(?P<where>[^`]+)`)"
                   r"(?:\s+`(?P<hash>[0-9a-f]{7})`)?\s*(?P<rest>.*)$")


@dataclass(frozen=True)
class ReportCell:
    status: str
    where: str | None
    text_hash: str | None
    marker: str


def _parse_cell(text: str) -> ReportCell | None:
    match = _CELL.match(text.strip())
    if not match:
        return None
    rest = match["rest"].replace("**", "").strip()
    marker = {"": "", "new": NEW, "sig changed": SIG_CHANGED, "sig changed (annotations only)": ANNOTATIONS_ONLY,
              "≈": FORMAT_ONLY}.get(rest, rest)
    if match["mark"] == "✗":
        return ReportCell(ABSENT, None, None, marker)
    if match["kind"] == "inherited":
        return ReportCell(INHERITED, match["where"], match["hash"], marker)
    if match["kind"]:
        return ReportCell(match["kind"], match["where"], match["hash"], marker)
    return ReportCell(PRESENT, None, match["hash"], marker)


def _section_text(report: str, heading: str) -> str:
    start = report.index(heading)
    end = report.find("\n## ", start + len(heading))
    return report[start:end if end >= 0 else None]


def parse_tables(section: str) -> dict[tuple[str, str], ReportCell]:
    """(short symbol name, version) -> cell, from every table whose first column is `version`."""
    cells: dict[tuple[str, str], ReportCell] = {}
    header: list[str] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        columns = [c.strip() for c in line.strip().strip("|").split("|")]
        if columns[0] == "version":
            header = columns
        elif header and re.match(r"^\d+\.\d+", columns[0]):
            for name, text in zip(header[1:], columns[1:], strict=False):
                cell = _parse_cell(text)
                if cell is not None:
                    cells[(name, columns[0])] = cell
    return cells


def parse_signatures(section: str, versions: list[str]) -> dict[tuple[str, str], str | None]:
    """(short name, version) -> signature (None: absent), from the "- `Sym`" / "  - A – B: `sig`" lists."""
    found: dict[tuple[str, str], str | None] = {}
    symbol = None
    examined = sorted({Version(v) for v in versions})
    for line in section.splitlines():
        top = re.match(r"^- `([^`]+)`\s*$", line)
        if top:
            symbol = top[1]
            continue
        entry = re.match(r"^  - (\S+)(?: – (\S+))?: (?:`(.*)`|absent)\s*$", line)
        if symbol and entry:
            low, high = Version(entry[1]), Version(entry[2] or entry[1])
            signature = entry[3]
            if signature is not None:
                signature = re.sub(r"\s+\[(inherited|replaced|moved): [^\]]+\]$", "", signature).strip()
            for version in examined:
                if low <= version <= high:
                    found[(symbol, str(version))] = signature
        elif not line.startswith("  "):
            symbol = None
    return found


def _shown(facts_status: str, where: str | None) -> str:
    return f"{facts_status}:{where}" if facts_status == INHERITED else facts_status


@dataclass
class Tally:
    cells: int = 0  #: presence (present / absent / inherited from where)
    hashes: int = 0  #: source-text hashes
    markers: int = 0  #: non-empty change markers (new, sig changed, annotations only, formatting only)
    signatures: int = 0  #: full signatures

    def __str__(self) -> str:
        return (f"{self.cells} cells (presence), {self.hashes} source hashes, {self.markers} change markers, "
                f"{self.signatures} full signatures compared")


def compare(observations: list[Observation], cells: dict[tuple[str, str], ReportCell],
            signatures: dict[tuple[str, str], str | None], first: str) -> tuple[Tally, list[str]]:
    tally, problems = Tally(), []
    for obs in observations:
        short = obs.symbol.partition(":")[2]
        cell = cells.get((short, obs.version))
        label = f"{obs.distribution} {obs.version} {short}"
        if cell is None:
            problems.append(f"{label}: not in the report's tables")
            continue
        facts = obs.facts
        tally.cells += 1
        if cell.status != facts.status or (cell.status == INHERITED and cell.where != facts.defined_at):
            problems.append(f"{label}: report says {_shown(cell.status, cell.where)}, static found "
                            f"{_shown(facts.status, facts.defined_at)}")
            continue
        if cell.text_hash:
            tally.hashes += 1
            if cell.text_hash != facts.text_hash:
                problems.append(f"{label}: source hash {facts.text_hash}, report {cell.text_hash}")
        if obs.version != first:
            tally.markers += bool(cell.marker)
            if cell.marker != obs.change and not (cell.marker == "" and obs.change == "changed"):
                problems.append(f"{label}: change {obs.change or 'none'!r}, report {cell.marker or 'none'!r}")
        expected = signatures.get((short, obs.version))
        if expected is not None:
            tally.signatures += 1
            if facts.signature != expected:
                problems.append(f"{label}: signature\n      static {facts.signature}\n      report {expected}")
    return tally, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--symbols", type=Path, default=HERE / "upstream_symbols.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = args.report.read_text()
    wanted = yaml.safe_load(args.symbols.read_text())
    total, failures = 0, []  # cells
    for heading, (dist, spec) in zip(SECTIONS, wanted.items(), strict=True):
        section = _section_text(report, heading)
        observations = survey(dist, spec["versions"], spec["symbols"], args.cache)
        signatures = parse_signatures(section, spec["versions"])
        tally, problems = compare(observations, parse_tables(section), signatures, spec["versions"][0])
        sys.stdout.write(f"{dist}: {len(spec['versions'])} releases x {len(spec['symbols'])} symbols: {tally}; "
                         f"{len(problems)} disagreement(s)\n")
        total += tally.cells
        failures += problems
    for problem in failures:
        sys.stdout.write(f"  DISAGREE {problem}\n")
    sys.stdout.write(f"total: {total} cells, {len(failures)} disagreement(s)\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
