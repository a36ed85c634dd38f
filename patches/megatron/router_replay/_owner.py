"""Which router replay drives this process's routers, and whether patchkit may drive them.

Upstream's ``moe/router_replay.py`` (megatron-core 0.16+) or the backport the
``megatron.router_replay`` patch installs on 0.14/0.15: both define ``RouterReplay`` and
``RouterReplayAction`` with the same names and values, so everything here asks
:func:`replay_module` and never branches on the release. Imports neither torch nor megatron at
the top (``patchkit.patches.megatron.router_replay`` re-exports from here and must stay import-light).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NamedTuple, Union

from .._constants import Action
from .._errors import RouterReplayConflictError, RouterReplayError, RouterReplayUnavailableError


def replay_module() -> Any:
    """Upstream's ``router_replay`` module where megatron-core has it (0.16+), else the backport."""
    try:
        from megatron.core.transformer.moe import router_replay
    except ImportError:
        from ._router_replay import backport as router_replay
    return router_replay


def replay_class() -> Any:
    return replay_module().RouterReplay


def process_routers() -> list[Any]:
    """Every MoE layer's replay state in this process, in the order the layers were built."""
    return list(getattr(replay_class(), "global_router_replay_instances", ()))


class Ownership(NamedTuple):
    """Who drives router replay in this process (see ``router_replay.ownership``)."""

    owner: str
    """``"patchkit"`` (the 0.14/0.15 backport), ``"megatron-core"`` (native), ``"foreign"`` (another
    framework's patch: patchkit stands aside), or ``"none"`` (no router with replay state)."""
    detail: str


def foreign_signs(instances: Sequence[Any], expected: Any) -> list[str]:
    """What shows that another framework's replay patch owns the routers (empty: nothing does)."""
    signs = []
    router_module = sys.modules.get("megatron.core.transformer.moe.router")
    module_cls = getattr(router_module, "RouterReplay", None)
    if module_cls is not None and not hasattr(module_cls, "global_router_replay_instances"):
        signs.append(
            f"megatron.core.transformer.moe.router.RouterReplay is {module_cls.__module__}.{module_cls.__qualname__}, "
            "which keeps no global_router_replay_instances"
        )
    topk_router = getattr(router_module, "TopKRouter", None)
    if topk_router is not None and getattr(topk_router, "_router_replay_patched", False):
        signs.append("TopKRouter carries another framework's replay patch (_router_replay_patched)")
    strangers = {type(r) for r in instances if not isinstance(r, expected)}
    for cls in sorted(strangers, key=lambda c: c.__qualname__):
        signs.append(f"routers hold replay state of class {cls.__module__}.{cls.__qualname__}")
    return signs


def ownership_of(instances: Sequence[Any]) -> Ownership:
    """Whether patchkit's replay, megatron-core's or another framework's drives ``instances``."""
    expected = replay_class()
    signs = foreign_signs(instances, expected)
    if signs:
        return Ownership("foreign", "; ".join(signs))
    if not instances:
        return Ownership("none", "no MoE router with replay state")
    native = expected.__module__.startswith("megatron.")
    return Ownership("megatron-core" if native else "patchkit", f"{len(instances)} routers, {expected.__qualname__}")


def check_ownership(instances: Sequence[Any], expected: Any) -> None:
    """Raise :class:`RouterReplayConflictError` if another framework's replay owns the routers."""
    signs = foreign_signs(instances, expected)
    if signs:
        raise RouterReplayConflictError(
            "another framework's router replay patch owns the routers (" + "; ".join(signs) + "); patchkit "
            "stands aside: drive replay through that framework, or do not install its patch"
        )


def require_routers() -> list[Any]:
    """This process's replay states, owned by patchkit or megatron-core; raises if there are none."""
    instances = process_routers()
    if not instances:
        check_ownership([], replay_class())
        raise RouterReplayUnavailableError(
            "no MoE router has replay state: call router_replay.enable(config) before building "
            "the model, and on megatron-core < 0.16 apply the patch 'megatron.router_replay' "
            "(patchkit.apply_all()) before the model is built"
        )
    check_ownership(instances, replay_class())
    return instances


def upstream_action(action: Union[Action, str, None]) -> Any:
    """The installed replay's ``RouterReplayAction`` for ``action`` (None stays None)."""
    if action is None:
        return None
    try:
        wanted = Action(action)
    except ValueError:
        raise RouterReplayError(
            f"unknown router replay action {action!r}; expected one of "
            f"{[a.value for a in Action]} or None"
        ) from None
    return replay_module().RouterReplayAction(wanted.value)
