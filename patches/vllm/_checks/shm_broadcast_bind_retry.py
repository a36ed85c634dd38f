"""Self-check of ``vllm.shm_broadcast_bind_retry``: vLLM's ``MessageQueue`` with a remote reader, built while
another socket holds the port its probe found free, binds anyway and advertises a port a subscriber reaches
(the patch's retry on 0.24-0.28; vLLM's own port-0 bind from 0.29)."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ._lost_port_race import queue_after_a_lost_port_race


def check_shm_broadcast_bind_retry(context: CheckContext) -> None:
    """A queue whose probed port was taken binds another and advertises it; a subscriber reaches it there."""
    outcome = queue_after_a_lost_port_race()
    error = outcome["error"]
    expect(error is None, "vLLM's MessageQueue built while another socket holds the port its probe found free",
           "bound", f"{type(error).__name__}: {error}" if error is not None else None)
    lost = f":{outcome['lost_port']}"
    expect(not str(outcome["advertised"]).endswith(lost), "the queue's advertised remote address",
           "another port than the one taken", outcome["advertised"])
    expect(outcome["reached"], "a subscriber connected to the advertised address reaches the queue", True,
           outcome["reached"])
