"""Imported once by the multiprocessing fork server of the EP test, so each rank forks with Megatron-Bridge
already loaded (a fresh interpreter per rank would spend ~8 s importing it) from a process that has
run nothing else (forking the pytest process itself, with gloo and torch threads used, is unsafe)."""

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: te_harness

from te_harness import bridge_import_context, load_modelopt_megatron_plugin  # noqa: E402

if importlib.util.find_spec("modelopt") is not None:
    load_modelopt_megatron_plugin()
with bridge_import_context():
    import megatron.bridge.models.conversion.model_bridge  # noqa: F401

import patchkit  # noqa: E402,F401
