"""The TransformerEngine import stub of the Bridge tests: now the shared ``tests/te_harness.py`` (see there)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from te_harness import MEGATRON_CORE_FIRST, bridge_import_context, te_import_stub  # noqa: E402

__all__ = ["MEGATRON_CORE_FIRST", "bridge_import_context", "te_import_stub"]
