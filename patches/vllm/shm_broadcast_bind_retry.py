"""vLLM's shared-memory broadcast queue binding its TCP socket when another process took its port first.

Declaration only (see docs/writing-patches.md). ``MessageQueue.__init__``
(``vllm/distributed/device_communicators/shm_broadcast.py``) gives a queue with remote readers a ZMQ
``XPUB`` socket on TCP. Up to 0.28 it picks the port with ``get_open_port()``, which binds a probe
socket and releases it, and binds the ZMQ socket several statements later: a process that binds the
port in between (another worker of the node probing from the same ``VLLM_PORT``) makes the queue
fail with ``ZMQError: Address already in use``. Every worker of a node-spanning engine that is not on
the driver's node builds such a queue at the same instant, so the race is lost reliably there.

The patch retries the bind on the next free port (searched from ``VLLM_PORT`` when it is set, as
vLLM's own search is) and advertises the port actually bound in the queue's handle. From 0.29 vLLM
binds port 0 and reads the kernel's choice back (vLLM #50960): no probe, no race, ``native``.

Ranges: the probe-then-bind code read in 0.24.0 and tested there; the port-0 bind read in 0.29.0, 0.32.0 and
0.33.0 and tested there. 0.25-0.28 lie inside the patched range unrun (NeMo-RL patches the same
probe-then-bind in 0.25.1); on a release that already binds port 0 the patch never retries and the
handle stays as vLLM made it.
"""

from __future__ import annotations

from patchkit import Patch, Replace, Variant, Wrap

SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"

PATCHES = (
    Patch(
        id="vllm.shm_broadcast_bind_retry",
        self_check="._checks.shm_broadcast_bind_retry:check_shm_broadcast_bind_retry",
        summary=(
            "vLLM's shared-memory broadcast queue binds its TCP socket on the next free port when another "
            "process took the probed one (EADDRINUSE), and advertises the port it bound."
        ),
        why=(
            "MessageQueue probes a port with get_open_port() and binds it later; workers of a node-spanning "
            "engine probe from the same VLLM_PORT at once and all but one die with 'Address already in use'."
        ),
        upstream="https://github.com/vllm-project/vllm/pull/50960",
        removal="Nothing is installed from vLLM 0.29 (port 0, native); drop the patched variant with 0.28.",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.29"},
                installs=(
                    Replace(f"{SHM_BROADCAST}:Context", "._shm_broadcast_bind_retry:BindRetryContext"),
                    Wrap(f"{SHM_BROADCAST}:MessageQueue.__init__", "._shm_broadcast_bind_retry:wrap_init"),
                ),
                label="retry-bind",
            ),
            Variant(
                requires={"vllm": ">=0.29,<0.34"},
                native=(
                    "MessageQueue binds its remote socket to port 0 and reads the port the kernel chose "
                    "(zmq.LAST_ENDPOINT): no probe, no window for another process"
                ),
            ),
        ),
    ),
)
