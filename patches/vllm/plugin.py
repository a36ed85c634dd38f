"""The ``vllm.general_plugins`` entry point: patchkit in every process vLLM starts.

vLLM calls ``load_general_plugins()`` in the API server, the engine core and every worker
(``vllm/plugins/__init__.py``, unchanged 0.10-0.33); each entry point in the group is loaded unless
``VLLM_PLUGINS`` is set and does not name it. ``pyproject.toml`` registers this module's
:func:`load` under the name ``patchkit``, so ``VLLM_PLUGINS=patchkit,...`` keeps it and a list
without ``patchkit`` skips it. The other hosts' entry points (SGLang, verl) and what every one of
them does are in ``patchkit.patches.entry_points``.
"""

from __future__ import annotations


def load() -> None:
    """Apply patchkit's catalogue, honouring the ``PATCHKIT_*`` variables.

    Safe to call more than once per process (``apply_all`` is idempotent). Never raises into vLLM
    unless ``PATCHKIT_STRICT`` is set: a broken patch must not stop a worker from starting.
    ``PATCHKIT_AUTOLOAD`` set to an off value makes it stand aside.
    """
    from ..entry_points import apply_for_host

    apply_for_host("vLLM")
