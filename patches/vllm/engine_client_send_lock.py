"""vLLM's async engine client sending one request's frames while another thread sends another's.

Declaration only (see docs/writing-patches.md). ``AsyncMPClient`` (``vllm/v1/engine/core_client.py``)
sends every request to its engine cores as one multipart message on ``input_socket``, a
``zmq.asyncio`` ROUTER socket: ``_send_input_message`` calls ``input_socket.send_multipart``, which
sends the frames at once through the plain socket beneath it (its ``_shadow_sock``), one ``send`` per
frame. A ZMQ socket is not thread-safe. When two OS threads drive one ``AsyncLLM`` (an HTTP server
running its own event loop in a thread beside the trainer's loop, weight updates sent while requests
stream in), their frames interleave: the engine receives one thread's routing frame inside the other's
message, decodes garbage or never sees the request, and the engine stalls.

The patch serialises ``send_multipart`` on the client's input socket with a lock, for the whole
message: the frames of one request leave together whichever thread sends them. No release from 0.24
to 0.33 guards the socket (each sends from ``_send_input_message`` with no lock).

Ranges: the unguarded send read in 0.24.0 to 0.33.0 (every release); tested on 0.24.0, 0.29.0 and 0.33.0.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

CORE_CLIENT = "vllm.v1.engine.core_client"

PATCHES = (
    Patch(
        id="vllm.engine_client_send_lock",
        self_check="._checks.engine_client_send_lock:check_engine_client_send_lock",
        summary=(
            "vLLM's async engine client sends each request's frames to its engine cores under a lock, so "
            "threads sharing one AsyncLLM never interleave their multipart messages."
        ),
        why=(
            "AsyncMPClient sends on one ZMQ socket from whichever thread calls it; ZMQ sockets are not "
            "thread-safe, and two threads' frames interleave into messages the engine cannot decode."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/engine/core_client.py",
        removal="Drop when AsyncMPClient serialises its input socket's sends itself (none does up to 0.33).",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                installs=(
                    Wrap(f"{CORE_CLIENT}:AsyncMPClient.__init__", "._engine_client_send_lock:wrap_init"),
                ),
                label="locked-input-sends",
            ),
        ),
    ),
)
