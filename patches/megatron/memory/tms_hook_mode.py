"""Keep torch_memory_saver's hook mode when megatron-core is imported (megatron-core 0.16-0.19).

Declaration module. megatron-core 0.16.1-0.19.2 run ``torch_memory_saver.hook_mode = "torch"`` at
module level in ``core/inference/contexts/dynamic_context.py`` (and from 0.17, where the wheel ships
it, ``training/training.py``). The assignment runs inside the import, so no patch of those modules
could act before it: the patch wraps torch_memory_saver's own ``hook_mode`` setter instead and
drops that one assignment when the process already chose a mode. Releases before 0.16 do not touch
the hook mode: declared native there, with a check showing it.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_HOOK_MODE = "torch_memory_saver.entrypoint:TorchMemorySaver.hook_mode"

PATCHES = (
    Patch(
        id="megatron.tms_hook_mode",
        self_check="._checks.tms_hook_mode:check_tms_hook_mode",
        summary=(
            "Importing megatron-core keeps the torch_memory_saver hook mode the process chose (set "
            "before, or preload under LD_PRELOAD) and no longer raises on an initialised saver; "
            "megatron's 'torch' applies only where nothing was chosen."
        ),
        why=(
            "megatron-core 0.16-0.19 set torch_memory_saver.hook_mode = 'torch' at import. A process "
            "run in preload mode (SGLang's scheduler, a colocated Megatron worker under LD_PRELOAD) "
            "then allocates through the torch hook, whose memory CUDA IPC cannot share; a saver "
            "already initialised makes the import itself raise AttributeError. slime and NeMo-RL "
            "comment the line out of megatron's files."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"
            "megatron/core/inference/contexts/dynamic_context.py"
        ),
        removal="Remove once megatron-core stops setting the hook mode at import (still on main d98e8a6).",
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="native-before-0.16",
                requires={"megatron-core": ">=0.14,<0.16", "torch-memory-saver": ">=0.0.1"},
                native="megatron-core before 0.16 does not set torch_memory_saver.hook_mode",
            ),
            Variant(
                label="keep-process-hook-mode",
                requires={"megatron-core": ">=0.16,<0.20", "torch-memory-saver": ">=0.0.1"},
                installs=(Wrap(_HOOK_MODE, "._tms_hook_mode:wrap_hook_mode"),),
            ),
        ),
    ),
)
