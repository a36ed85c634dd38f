"""The main job's two commands (``nox -s demo``): ``patchkit status`` and ``patchkit doctor`` on the demo
stack, with Megatron-Bridge importable on a machine without CUDA.

Megatron-Bridge imports TransformerEngine at module level, and TransformerEngine cannot be installed
without CUDA. As in the Bridge test environments, Bridge is imported once under
``tests/te_harness.py``'s import stand-in (megatron-core imported first, so it still sees no TE; no TE
kernel ever runs), then the command runs in the same process as ``patchkit ARGS`` would. Where a real
TransformerEngine is installed it is used instead.

    python tests/demo_stack.py status
    python tests/demo_stack.py doctor --device cpu
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from te_harness import bridge_import_context, bridge_peft_without_te, load_modelopt_megatron_plugin  # noqa: E402

#: The Bridge modules the catalogue's Bridge patches target, imported under the stand-in.
BRIDGE_MODULES = (
    "megatron.bridge",
    "megatron.bridge.models.conversion.model_bridge",
    "megatron.bridge.models.conversion.param_mapping",
    "megatron.bridge.models.gpt_provider",
)


def import_bridge() -> int:
    """Import Megatron-Bridge (and ModelOpt's Megatron plugin first) where they are installed; the
    number of lines the upstreams printed meanwhile (kept out of the report, as patchkit's commands do)."""
    printed = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: printed.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        if importlib.util.find_spec("modelopt") is not None and importlib.util.find_spec("megatron.core") is not None:
            load_modelopt_megatron_plugin()
        if importlib.util.find_spec("megatron.bridge") is not None:
            with bridge_import_context():
                for name in BRIDGE_MODULES:
                    importlib.import_module(name)
            bridge_peft_without_te()  # the LoRA self-checks run on Megatron's local linears
    return len(printed.getvalue().splitlines())


if __name__ == "__main__":
    lines = import_bridge()
    sys.stderr.write(f"demo: Megatron-Bridge imported under the TransformerEngine import stand-in "
                     f"(upstreams printed {lines} line(s))\n")
    from patchkit.cli import main

    sys.exit(main(sys.argv[1:]))
