"""vLLM's RayExecutorV2 choosing its TCPStore port where the broadcast queue does not search.

Declaration only (see docs/writing-patches.md). ``RayExecutorV2._init_executor``
(``vllm/v1/executor/ray_executor_v2.py``) of 0.24-0.28 picks the port of torch.distributed's TCPStore with a
probe that binds and releases it (0.24: ``get_open_port()``; 0.25-0.28: ``_select_tcpstore_port``, which
falls back to ``get_open_port()``), and the rank-0 worker binds it much later. In between it builds the
broadcast ``MessageQueue``; an engine spanning nodes gives it a TCP socket, whose port the queue finds with
``get_open_port()`` too and binds at once. With ``VLLM_PORT`` set both searches start there, so the queue
takes the very port the probe released, and the rank-0 worker's store fails with ``EADDRINUSE``. On
0.25-0.28 the data-parallel window ``_select_tcpstore_port`` tries first starts at
``data_parallel_master_port + 100``: port 100 for an engine that is not data-parallel
(``ParallelConfig`` leaves it rank 0 with master port 0), privileged, so it falls back to ``VLLM_PORT``.

With ``VLLM_PORT`` set, the patch searches the store's port in ``VLLM_PORT + 32`` to ``VLLM_PORT + 63``
first, past the queue's search, inside the 100 ports an engine is given from ``VLLM_PORT``: the module's
``get_open_port`` (its only use is the store's port) is replaced, and on 0.25-0.28 ``_select_tcpstore_port``
tries the window before vLLM's data-parallel window when the engine is not data-parallel (NeMo-RL's order,
for every engine it builds). A data-parallel engine (a master port) keeps vLLM's disjoint per-rank windows
first, the store's window after them; ``PATCHKIT_RAY_STORE_PORT_WINDOW=always`` puts the window first for it
too, as NeMo-RL does. vLLM's ``get_open_port()`` when ``VLLM_PORT`` is unset or the window is full. From
0.29 the rank-0 worker binds its TCPStore on port 0 and keeps it open until ``init_process_group`` uses it
(``create_dist_init_method``): no probe, ``native``.

Ranges: the probe read in ``ray_executor_v2.py`` of 0.24.0 (inline ``get_open_port()``) and 0.25.0, 0.25.1,
0.26.0, 0.27.0, 0.28.0 (one file, ``_select_tcpstore_port``); tested on 0.24.0, and the 0.25.0 file run
on 0.24's vLLM (the two differ only in the store's port) by hand. The port-0 store read in 0.29.0 to
0.33.0, tested on 0.29.0 and 0.33.0.
"""

from __future__ import annotations

from patchkit import Call, Patch, Replace, Variant

RAY_EXECUTOR_V2 = "vllm.v1.executor.ray_executor_v2"

PATCHES = (
    Patch(
        id="vllm.ray_store_port_window",
        self_check="._checks.ray_store_port_window:check_ray_store_port_window",
        summary=(
            "vLLM's RayExecutorV2 (0.24-0.28) searches its TCPStore port from VLLM_PORT + 32 (32 ports), past "
            "the broadcast queue's search from VLLM_PORT, so the two never take one port "
            "(PATCHKIT_RAY_STORE_PORT_WINDOW for data-parallel engines)."
        ),
        why=(
            "RayExecutorV2 probes the store's port, then builds the broadcast queue, which binds the first free "
            "port from VLLM_PORT: the port just probed. A node-spanning engine's rank-0 worker then fails to "
            "bind its TCPStore (EADDRINUSE)."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.29.0/vllm/v1/executor/ray_executor_v2.py",
        removal="Nothing is installed from vLLM 0.29 (the worker binds port 0, native); drop with 0.28.",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.29"},
                installs=(
                    Replace(f"{RAY_EXECUTOR_V2}:get_open_port", "._ray_store_port_window:store_port"),
                    Call("._ray_store_port_window:install_window_before_dp_window",
                         "._ray_store_port_window:uninstall_window_before_dp_window", after=RAY_EXECUTOR_V2),
                ),
                label="store-port-window",
            ),
            Variant(
                requires={"vllm": ">=0.29,<0.34"},
                native=(
                    "the rank-0 worker binds its TCPStore on port 0 and keeps it open until "
                    "init_process_group uses it: no probe for the queue to take"
                ),
            ),
        ),
    ),
)
