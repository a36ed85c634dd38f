"""Checks of Markdown source and of its rendered HTML that the package index's renderer does not make.

GitHub-flavoured Markdown ends a table only at a blank line: a paragraph written straight after a
table becomes one more row (its text in the first cell), and a row with more cells than the header
loses the extra ones without a word. Both render "successfully".
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

_FENCE = re.compile(r"^\s*(```|~~~)")
#: Lines that start another block (HTML, heading, quote, list): they end a table as a blank line does.
_BLOCK_START = re.compile(r"^\s*(<|#{1,6} |> |[-*+] |\d+[.)] )")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> int:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return len(_UNESCAPED_PIPE.split(inner))


def table_problems(text: str) -> list[str]:
    """Tables followed by a line that is not a row or a blank line, and rows wider than their header."""
    problems: list[str] = []
    lines = text.splitlines()
    fenced = False
    header: int | None = None
    for number, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
            header = None
            continue
        if fenced:
            continue
        is_row = line.lstrip().startswith("|")
        if header is None:
            following = lines[number] if number < len(lines) else ""
            if is_row and re.fullmatch(r"\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*", following):
                header = _cells(line)
            continue
        if not line.strip():
            header = None
        elif not is_row and _BLOCK_START.match(line):
            header = None
        elif not is_row:
            problems.append(f"line {number}: text right after a table becomes a table row; add a blank line")
            header = None
        elif _cells(line) > header and not re.fullmatch(r"\s*\|?[\s:|-]+\|?\s*", line):
            problems.append(f"line {number}: {_cells(line)} cells under a {header}-cell header; the rest is dropped")
    return problems


class _Rows(HTMLParser):
    """Rows of rendered tables: each row's cells' text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def swallowed_rows(rendered: str) -> list[str]:
    """Rendered table rows that hold text in their first cell only: a paragraph swallowed by a table."""
    parser = _Rows()
    parser.feed(rendered)
    return [row[0] for row in parser.rows if len(row) > 1 and row[0] and not any(row[1:])]
