"""Fixtures for process tests; the toy distribution they patch is described in procs_toy.py."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/_multiprocess.py
from procs_toy import TOY_FILES, Toy  # noqa: E402

from patchkit.processes.autoload import ACTIVE_MARKER
from patchkit.processes.launcher import hook_installed
from patchkit.runtime import settings


@pytest.fixture(scope="session")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toy]:
    if hook_installed() is None:
        pytest.fail("patchkit's start-up hook is not installed in this interpreter: "
                    "install patchkit with `pip install -e .` or `pip install .`")
    site = tmp_path_factory.mktemp("toy-site")
    for name, text in TOY_FILES.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(textwrap.dedent(text).lstrip())
    yield Toy(site)


@pytest.fixture(autouse=True)
def _clean_patchkit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests in this process see no PATCHKIT_* variable they did not set themselves."""
    for name in (*settings.VARIABLES, ACTIVE_MARKER):
        monkeypatch.delenv(name, raising=False)
