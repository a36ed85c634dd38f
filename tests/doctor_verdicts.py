"""``patchkit doctor``'s verdict on one patch, as the self-check tests of every upstream ask for it: on the
CPU, with the patch applied or not, and with the patch bypassed (upstream's code back in its place) or,
where upstream has the behaviour natively, with that behaviour taken away."""

from __future__ import annotations

import contextlib
from typing import Callable

import patchkit
from patchkit.doctor import Verdict, run
from patchkit.selfcheck import upstream_behaviour


def verdict_of(patch_id: str, *, applied: bool = False, as_upstream: bool = False) -> Verdict:
    """The doctor's verdict on ``patch_id``: with the patch applied for the call when ``applied``, and with
    upstream's code put back in its place (the status still saying applied) when ``as_upstream``."""
    with contextlib.ExitStack() as stack:
        if applied:
            stack.enter_context(patchkit.applied(patch_id))
        if as_upstream:
            stack.enter_context(upstream_behaviour(patch_id))
        (verdict,) = run([patch_id], device="cpu")[0]
    return verdict


def bypassed_verdict(patch_id: str, native: bool, take_native_away: Callable[[], object]) -> Verdict:
    """The verdict on an applied patch with upstream's code back, or on a native one once
    ``take_native_away()`` has removed upstream's behaviour: either way its check must fail."""
    if native:
        take_native_away()
        return verdict_of(patch_id)
    return verdict_of(patch_id, as_upstream=True)
