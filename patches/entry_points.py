"""Every host entry point in one place: patchkit applied in the processes of RL frameworks and inference engines.

Each host scans one ``importlib.metadata`` entry-point group; ``pyproject.toml`` registers patchkit
under the name ``patchkit`` in each, so the host's own allow-list names it:

============================ ================================================ ======================================
group                        loader (what it does with the entry point)       patchkit's target
============================ ================================================ ======================================
``vllm.general_plugins``     ``vllm/plugins/__init__.py``                     :func:`vllm`
                             ``load_general_plugins``: ``ep.load()``, then
                             calls it, in the API server, the engine core and
                             every worker (unchanged 0.10-0.33);
                             ``VLLM_PLUGINS`` names the allowed plugins
``sglang.srt.plugins``       ``python/sglang/srt/plugins/__init__.py``        :func:`sglang`
                             ``load_plugins``: ``ep.load()``, then calls it
                             (main, scheduler and worker processes);
                             ``SGLANG_PLUGINS`` names the allowed plugins
``verl.plugins``             ``verl/__init__.py``, at ``import verl``:        ``verl_applied`` (below)
                             ``ep.load()`` only, never calls it, exceptions
                             logged at debug; ``VERL_USE_EXTERNAL_PLUGINS`` is
                             ``auto`` (default), ``none`` or a list of names
============================ ================================================ ======================================

verl only resolves its entry point, so resolving it has to be the hook: ``verl_applied`` is not a
variable of this module but a name its ``__getattr__`` (PEP 562) answers by applying patchkit
(importing the module alone applies nothing). Every hook does the same, :func:`apply_for_host`.

Opting out: the host's own allow-list; ``PATCHKIT_DISABLE`` / ``PATCHKIT_ENABLE`` (read by
``apply_all``); ``PATCHKIT_AUTOLOAD`` set to an off value (``0``, ``false``, ``no``, ``off``), which
makes every entry point stand aside.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

#: The entry-point groups patchkit registers in (``pyproject.toml``), by host.
GROUPS = {"vllm": "vllm.general_plugins", "sglang": "sglang.srt.plugins", "verl": "verl.plugins"}
#: The name patchkit's entry points have in every group: what a host's allow-list must name.
ENTRY_POINT_NAME = "patchkit"


def apply_for_host(host: str) -> list[str]:
    """Apply patchkit's catalogue from a host's plugin loader; the ids installed (empty if it stood aside).

    Honours the ``PATCHKIT_*`` variables; stands aside when ``PATCHKIT_AUTOLOAD`` is set to an off
    value. Safe to call more than once per process (``apply_all`` is idempotent). Never raises into
    the host unless ``PATCHKIT_STRICT`` is set: a broken patch must not stop a worker from starting.
    """
    import patchkit

    if _autoload_switched_off():
        logger.debug("patchkit: %s plugin stands aside (PATCHKIT_AUTOLOAD is off)", host)
        return []
    try:
        records = patchkit.apply_all()
    except Exception:
        if _strict():
            raise
        logger.exception("patchkit: the %s plugin could not apply patches; continuing without them", host)
        return []
    installed = sorted(r.id for r in records if r.state.installed)
    logger.debug("patchkit: %s plugin applied %s", host, ", ".join(installed) or "nothing")
    return installed


def vllm() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM's ``load_general_plugins()`` calls it in every process."""
    apply_for_host("vLLM")


def sglang() -> None:
    """The ``sglang.srt.plugins`` entry point: SGLang's ``load_plugins()`` calls it."""
    apply_for_host("SGLang")


def __getattr__(name: str) -> Any:
    # verl's loader only resolves ``patchkit.patches.entry_points:verl_applied``; resolving is the call.
    if name == "verl_applied":
        return apply_for_host("verl")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _autoload_switched_off() -> bool:
    from patchkit import ConfigError
    from patchkit.runtime import settings

    value = os.environ.get(settings.AUTOLOAD, "")
    if not value:
        return False  # unset: the entry points apply, as a host's plugin is meant to
    try:
        return not settings.parse_bool(settings.AUTOLOAD, value)
    except ConfigError:
        return False  # malformed: apply_all reports it as a config error (and applies nothing)


def _strict() -> bool:
    from patchkit import ConfigError
    from patchkit.runtime import settings

    try:
        return settings.parse_bool(settings.STRICT, os.environ.get(settings.STRICT, ""))
    except ConfigError:
        return False
