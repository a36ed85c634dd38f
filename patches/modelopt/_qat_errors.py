"""Errors raised by the QAT helpers; importing this module costs nothing (no torch, no ModelOpt)."""

from __future__ import annotations

from typing import Sequence

from patchkit import PatchkitError


class QATConfigError(PatchkitError, ValueError):
    """A QAT request names something that does not exist: a mode, or modules the model lacks.

    Raised before the model is touched, so the model is left exactly as it was.
    """

    def __init__(self, problem: str, asked: str, available: Sequence[str], label: str = "available") -> None:
        self.asked = asked
        self.available = tuple(available)
        shown = ", ".join(self.available[:12])
        if len(self.available) > 12:
            shown += f", ... ({len(self.available)} in all)"
        super().__init__(f"{problem}: {asked!r}; {label}: {shown or 'none'}")
