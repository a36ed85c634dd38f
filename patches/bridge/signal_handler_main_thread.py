"""Megatron-Bridge's ``DistributedSignalHandler`` entered off the main thread.

Declaration module (data only; see docs/writing-patches.md). Bridge's training loop enters
``DistributedSignalHandler`` (``training/utils/sig_utils.py``; ``GlobalState.signal_handler`` and
``data/loaders.py``), whose ``__enter__`` calls ``signal.signal(self.sig, handler)``. CPython
installs handlers only from the main thread, so a trainer started in a worker thread (a Ray actor
method run in a thread, NeMo-RL's Megatron workers) fails with ``ValueError: signal only works in
main thread of the main interpreter``. Megatron-Bridge #4375 (v0.6.0) installs the handler only on
the main thread and restores it in ``release`` only when it was installed; the patch gives the
earlier releases that behaviour.

Ranges, from the wheels: ``sig_utils.py`` is the same file in 0.2.0rc6, 0.3.1, 0.4.2 and 0.5.1; 0.6.0
and 0.6.2 carry #4375. Tests ran on 0.3.1, 0.5.1 (patched) and 0.6.2 (native).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

SIG_UTILS = "megatron.bridge.training.utils.sig_utils"

PATCHES = (
    Patch(
        id="bridge.signal_handler_main_thread",
        self_check="._checks.signal_handler_main_thread:check_signal_handler_main_thread",
        summary=(
            "DistributedSignalHandler can be entered off the main thread: the handler is installed on the "
            "main thread only."
        ),
        why=(
            "__enter__ calls signal.signal, which raises ValueError outside the main thread; trainers run in Ray "
            "worker threads (NeMo-RL patches __enter__ for this)."
        ),
        upstream="https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/4375",
        removal="Native from Bridge 0.6.0; remove with support for Bridge < 0.6.",
        version_modules={"megatron-bridge": "megatron.bridge"},
        variants=(
            Variant(
                requires={"megatron-bridge": ">=0.2.0rc0,<0.6.0"},
                installs=(
                    Wrap(f"{SIG_UTILS}:DistributedSignalHandler.__enter__", "._signal_handler_main_thread:wrap_enter"),
                    Wrap(f"{SIG_UTILS}:DistributedSignalHandler.release", "._signal_handler_main_thread:wrap_release"),
                ),
                label="main-thread-only",
            ),
            Variant(
                requires={"megatron-bridge": ">=0.6.0,<0.7.0rc0"},
                native="DistributedSignalHandler.__enter__ installs the handler only on the main thread (#4375)",
            ),
        ),
    ),
)
