"""The contract between a patch's self-check and ``patchkit doctor`` (and the tests that share it).

A patch declares ``self_check=".module:function"`` (resolved like its actions). The function takes a
:class:`CheckContext` and returns normally when the patch does its job on the installed upstream, or
raises :class:`SelfCheckFailed` saying what was expected and what came back. A check that can only run
on a GPU calls :meth:`CheckContext.require_cuda`; one whose upstream code needs a package that is not
installed raises :class:`MissingDependency`. The same functions are called by the test suite, so a
check and its test are one piece of code.

Nothing here imports torch or an upstream: check modules import those themselves.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, NamedTuple

from .runtime.errors import PatchkitError


class SelfCheckFailed(PatchkitError, AssertionError):
    """A self-check's expectation did not hold. An ``AssertionError``, so pytest shows it as a failure."""

    def __init__(self, expectation: str, expected: Any = None, found: Any = None) -> None:
        self.expectation = expectation
        self.expected = expected
        self.found = found
        detail = expectation if expected is None and found is None else (
            f"{expectation}: expected {expected}, found {found}")
        super().__init__(detail)


class NeedsGPU(PatchkitError):
    """The check can only run on a CUDA device, and the doctor runs on the CPU."""


class MissingDependency(PatchkitError):
    """The code the patch changes cannot run in this process (a package it needs is not installed): the
    doctor reports the patch ``not_applicable`` with this message."""


class CheckContext(NamedTuple):
    """What a self-check may ask of its caller."""

    patch_id: str
    #: "cpu" or "cuda": where tensors should live.
    device: str = "cpu"
    #: True when the patch is native here: the check then shows upstream doing the job.
    native: bool = False

    def require_cuda(self) -> None:
        if self.device != "cuda":
            raise NeedsGPU(f"{self.patch_id}: this check runs only on a CUDA device (--device cuda)")


def expect(condition: bool, expectation: str, expected: Any = None, found: Any = None) -> None:
    """Raise :class:`SelfCheckFailed` unless ``condition`` holds."""
    if not condition:
        raise SelfCheckFailed(expectation, expected, found)


@contextlib.contextmanager
def upstream_behaviour(patch_id: str, engine: Any = None) -> Iterator[None]:
    """For tests: put upstream's originals back while the patch still reports ``applied``.

    The patch's replacement then behaves exactly like upstream, which is what a broken or silently
    bypassed patch looks like from outside; a self-check run inside this block must fail, or it
    proves nothing. The installed objects come back on exit. Registrations (``Call``) cannot be
    bypassed this way and raise ``TypeError``.
    """
    from .runtime.installer import Installed

    if engine is None:
        from .runtime.process_engine import engine as process_engine

        engine = process_engine()
    installed = engine.installed_actions(patch_id)
    if not installed:
        raise ValueError(f"{patch_id} installed nothing in this process: apply it first")
    if not all(isinstance(action, Installed) for action in installed):
        raise TypeError(f"{patch_id} installs through a registration (Call); bypass it in its own test")
    for action in reversed(installed):
        action.restore()
    try:
        yield
    finally:
        for action in installed:
            setattr(action.owner, action.name, action.installed)


@contextlib.contextmanager
def patches_as_they_were(engine: Any = None) -> Iterator[None]:
    """For tests: revert on exit every patch that was not installed or waiting on entry.

    ``patchkit doctor`` applies what applies in its process (it is a diagnostic process); a test that
    runs it in the test process would otherwise leave patches installed for the tests after it, and
    patches whose target modules were not imported yet waiting to install themselves on a later
    test's import.
    """
    from .runtime.status import State

    if engine is None:
        from .runtime.process_engine import engine as process_engine

        engine = process_engine()

    def in_effect(status: Any) -> bool:
        return bool(status.state.installed or status.state is State.PENDING)

    before = {s.id for s in engine.status() if in_effect(s)}
    try:
        yield
    finally:
        for status in engine.status():
            if in_effect(status) and status.id not in before:
                engine.revert(status.id)
