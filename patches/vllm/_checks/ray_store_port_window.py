"""Self-check of ``vllm.ray_store_port_window``: RayExecutorV2, run up to its first worker actor for an engine
whose worker is on another node, gives the TCPStore a port the broadcast queue does not hold, and the store
binds it (the patch's window on 0.24-0.28; the rank-0 worker's port-0 store from 0.29)."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ._ray_boundary import free_port_base, require_ray, store_and_queue_ports


def check_ray_store_port_window(context: CheckContext) -> None:
    """The TCPStore's port and the broadcast queue's differ, and the store binds its own."""
    require_ray()
    ports = store_and_queue_ports(free_port_base())
    expect(ports["store_port"] != ports["queue_port"], "the TCPStore's port and the broadcast queue's",
           "two ports", ports)
    expect(ports["store_error"] is None, "a TCPStore binds the port RayExecutorV2 chose for it", None,
           ports["store_error"])
