"""The ``vllm.general_plugins`` entry point: patchkit in every process vLLM starts.

vLLM calls ``load_general_plugins()`` in the API server, the engine core and every worker
(``vllm/plugins/__init__.py``, unchanged 0.10-0.33); each entry point in the group is loaded unless
``VLLM_PLUGINS`` is set and does not name it. ``pyproject.toml`` registers this module's
:func:`load` under the name ``patchkit``, so ``VLLM_PLUGINS=patchkit,...`` keeps it and a list
without ``patchkit`` skips it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def load() -> None:
    """Apply patchkit's catalogue, honouring the ``PATCHKIT_*`` variables.

    Safe to call more than once per process (``apply_all`` is idempotent). Never raises into vLLM
    unless ``PATCHKIT_STRICT`` is set: a broken patch must not stop a worker from starting.
    """
    import patchkit

    try:
        records = patchkit.apply_all()
    except Exception:
        if _strict():
            raise
        logger.exception("patchkit: the vLLM plugin could not apply patches; continuing without them")
        return
    installed = sorted(r.id for r in records if r.state.installed)
    logger.debug("patchkit: vLLM plugin applied %s", ", ".join(installed) or "nothing")


def _strict() -> bool:
    import os

    from patchkit import ConfigError
    from patchkit.runtime import settings

    try:
        return settings.parse_bool(settings.STRICT, os.environ.get(settings.STRICT, ""))
    except ConfigError:
        return False
