"""Imported once by the multiprocessing fork server of the EP test, so each rank forks with Megatron-Bridge
already loaded (a fresh interpreter per rank would spend ~8 s importing it) from a process that has
run nothing else (forking the pytest process itself, with gloo and torch threads used, is unsafe)."""

from te_stub import bridge_import_context

with bridge_import_context():
    import megatron.bridge.models.conversion.model_bridge  # noqa: F401

import patchkit  # noqa: E402,F401
