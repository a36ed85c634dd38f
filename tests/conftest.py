"""Fixtures the tests of every upstream share."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

import patchkit
from patchkit.runtime.status import PatchStatus, Reason
from patchkit.selfcheck import patches_as_they_were


@pytest.fixture
def no_patchkit_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switches that choose what applies (PATCHKIT_DISABLE, _ENABLE, _STRICT, _FORCE, _LOG_LEVEL) unset."""
    for name in ("PATCHKIT_DISABLE", "PATCHKIT_ENABLE", "PATCHKIT_STRICT", "PATCHKIT_FORCE", "PATCHKIT_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def python_sigint_handler() -> Iterator[None]:
    """Python's own SIGINT handler for the test, whatever the process started with; the previous one after.

    A process started in the background by a non-interactive shell begins with SIGINT ignored, and
    Python keeps it so: tests about what a Ctrl-C does (or that send real SIGINTs) install the handler
    an interactive Python has.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def patches_restored() -> Iterator[None]:
    """Revert on exit every patch the test installed, or ``patchkit doctor`` installed for it.

    The doctor applies what applies in its process (it is a diagnostic process); a test that runs it
    here would otherwise leave patches installed for the tests after it. A module opts in with
    ``pytestmark = pytest.mark.usefixtures("patches_restored")``.
    """
    with patches_as_they_were():
        yield


@pytest.fixture
def applied(request: pytest.FixtureRequest) -> Iterator[PatchStatus]:
    """The test module's ``PATCH`` applied for the test (installed, or native on this release), reverted after."""
    with patchkit.applied(request.module.PATCH) as (record,):
        assert record.state.installed or record.reason is Reason.NATIVE, record.to_dict()
        yield record
