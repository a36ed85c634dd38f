"""Self-check of ``megatron.tms_hook_mode``: megatron-core's import-time ``hook_mode`` statements, run from the
installed files, keep the process's torch_memory_saver mode.
"""

from __future__ import annotations

from typing import Any

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import first_line


def _tms_outcome(module_name: str, code: Any, saver: Any) -> str:
    from ._tms_hook_mode_probe import pending_hook_mode, run_statement

    try:
        run_statement(module_name, code, saver)
    except Exception as exc:
        return first_line(exc)
    return str(pending_hook_mode(saver))


def check_tms_hook_mode(context: CheckContext) -> None:
    """megatron-core's import-time ``hook_mode`` statements, run from the installed files, keep the
    process's torch_memory_saver mode: a mode set before stays, LD_PRELOAD's preload stays, an
    initialised saver is left alone (no error); with nothing chosen, megatron's ``"torch"`` applies.
    On a release that has no such statement (native, before 0.16) there is nothing to keep."""
    from ._tms_hook_mode_probe import fresh_saver, hook_mode_statements, ld_preload

    statements = {name: codes for name, codes in hook_mode_statements().items() if codes}
    if not statements:
        return  # nothing in this release sets the hook mode at import
    for module_name, codes in statements.items():
        for code in codes:
            with ld_preload(False):
                kept = _tms_outcome(module_name, code, _preset(fresh_saver(), "preload"))
                expect(kept == "preload", f"importing {module_name} keeps a hook mode set before it",
                       "preload", kept)
                initialised = _tms_outcome(module_name, code, fresh_saver(initialised_as="preload"))
                expect(initialised == "None", f"importing {module_name} after torch_memory_saver was "
                       "initialised leaves the saver alone", "no error, nothing pending", initialised)
                chosen_by_megatron = _tms_outcome(module_name, code, fresh_saver())
                expect(chosen_by_megatron == "torch", f"importing {module_name} with no mode chosen "
                       "sets megatron's own", "torch", chosen_by_megatron)
            with ld_preload(True):
                preload = _tms_outcome(module_name, code, fresh_saver())
                expect(preload == "None", f"importing {module_name} under LD_PRELOAD of torch_memory_saver's "
                       "preload library keeps the preload default", "None (preload default)", preload)


def _preset(saver: Any, mode: str) -> Any:
    saver.hook_mode = mode
    return saver
