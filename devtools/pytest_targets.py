"""What a test session hands pytest: the environment's folders, or the tests named on the command line.

``nox -s tests-vllm-0.33 -- tests/vllm/test_refit.py`` should run that file, not the whole ``tests/vllm``
folder with the file appended (pytest would collect both). Options alone (``-- -x -k refit``) still
narrow the environment's own folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def names_tests(arg: str, root: Path) -> bool:
    """Whether a command-line argument is a test path or node id (``tests/x.py::test_y``) under root."""
    if arg.startswith("-"):
        return False
    return (root / arg.split("::", 1)[0]).exists()


def pytest_targets(defaults: Sequence[str], posargs: Sequence[str], root: Path) -> list[str]:
    """The positional part of the pytest call: posargs naming tests replace ``defaults``; otherwise the
    posargs (options) are added after them."""
    if any(names_tests(arg, root) for arg in posargs):
        return list(posargs)
    return [*defaults, *posargs]
