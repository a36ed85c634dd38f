"""Pipeline p2p on the default process group: ``_batched_p2p_ops`` and ``_communicate_shapes``.

Upstream passes the pipeline group to each ``torch.distributed.P2POp``; ``P2POp`` given no group uses
the default one. The peers (``prev_pipeline_rank``, ``next_pipeline_rank``, ``P2PCommunicator``'s
``prev_rank`` / ``next_rank``) are global ranks (mapped with ``get_global_rank``), which is what the
default group addresses.
"""

from __future__ import annotations

import functools
from typing import Any, Callable


def wrap_batched_p2p_ops(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_batched_p2p_ops`` whose ops go through the default group, whatever group it is given."""

    @functools.wraps(original)
    def batched_p2p_ops(**kwargs: Any) -> Any:
        return original(**{**kwargs, "group": None})

    return batched_p2p_ops


class OnDefaultGroup:
    """A ``P2PCommunicator`` as one call sees it: its own attributes, but the default group as
    ``pp_group``. The communicator itself is left as it is (other threads, later calls)."""

    def __init__(self, communicator: Any) -> None:
        self._communicator = communicator

    @property
    def pp_group(self) -> Any:
        import torch

        return torch.distributed.group.WORLD

    def __getattr__(self, name: str) -> Any:
        return getattr(self._communicator, name)


def wrap_communicate_shapes(original: Callable[..., Any]) -> Callable[..., Any]:
    """``P2PCommunicator._communicate_shapes`` (0.16+) that exchanges the shapes on the default group."""

    @functools.wraps(original)
    def communicate_shapes(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(OnDefaultGroup(self), *args, **kwargs)

    return communicate_shapes
