"""A stand-in for the ``ray`` package, at the names vLLM's Ray executors import: for tests only, where Ray is
not installed (the test environments install vLLM without its ``ray`` extra).

``vllm/v1/executor/ray_utils.py``, ``ray_executor.py`` and ``ray_executor_v2.py`` import ``ray``,
``ray.util.placement_group_table``, ``ray.util.placement_group.PlacementGroup``,
``ray._private.state.available_resources_per_node``, ``ray.actor.ActorHandle``, ``ray.types.ObjectRef`` and
``ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy`` (``ray_executor_v2.py`` cannot be imported
without them: a dataclass there annotates a field with ``ObjectRef``). Each is an inert name here; any call
into Ray raises. The calls vLLM's executors make at run time are answered by
``patches/vllm/_checks/_ray_boundary.py`` (``RayApi``), the same way with or without Ray installed.
Install it before anything imports ``vllm.v1.executor.ray_utils``: the tests run in a fresh interpreter.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


class _NotRay:
    """A Ray name vLLM imports; calling it means a test reached Ray itself."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: Ray is not installed here (a stand-in for vLLM's imports)")


def install() -> None:
    """Put the stand-in modules in ``sys.modules``; a real ``ray`` already importable is left alone."""
    try:
        import ray  # noqa: F401
    except ImportError:
        pass
    else:
        return
    names = {
        "ray": {},
        "ray.util": {"placement_group_table": _NotRay("ray.util.placement_group_table")},
        "ray.util.placement_group": {"PlacementGroup": type("PlacementGroup", (), {})},
        "ray.util.scheduling_strategies": {
            "PlacementGroupSchedulingStrategy": _NotRay("PlacementGroupSchedulingStrategy")},
        "ray._private": {},
        "ray._private.state": {"available_resources_per_node": _NotRay("available_resources_per_node")},
        "ray.actor": {"ActorHandle": type("ActorHandle", (), {})},
        "ray.types": {"ObjectRef": type("ObjectRef", (), {})},
    }
    for name, attributes in names.items():
        module = ModuleType(name)
        module.__dict__.update(attributes)
        module.__path__ = []  # a package: its submodules import
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
