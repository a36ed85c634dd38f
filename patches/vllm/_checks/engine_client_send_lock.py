"""Self-check of ``vllm.engine_client_send_lock``: two threads sending aborts through one vLLM ``AsyncMPClient``
at once, their frames handed over between them wherever nothing prevents it; the engine receives every
abort whole."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ._concurrent_sends import sends_from_two_threads


def check_engine_client_send_lock(context: CheckContext) -> None:
    """Every abort two threads send at once reaches the engine whole, in one message each."""
    outcome = sends_from_two_threads()
    expect(not outcome["errors"], "errors raised by the two sending threads", "none", outcome["errors"])
    expect(not outcome["garbled"], "messages the engine received with frames of two requests", "none",
           outcome["garbled"])
    expect(sorted(outcome["received"]) == sorted(outcome["sent"]), "the request ids the engine received whole",
           sorted(outcome["sent"]), sorted(outcome["received"]))
    expect(outcome["guarded"], "a send lock on the input socket of vLLM's AsyncMPClient", True, outcome["guarded"])
