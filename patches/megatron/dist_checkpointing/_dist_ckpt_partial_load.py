"""``MCoreLoadPlanner.create_local_plan`` that leaves tensors missing from the checkpoint out of the plan.

Before upstream's plan is made, the tensors the checkpoint metadata does not name are removed from
the planner's shape validation and ``allow_shape_mismatch`` lists, and torch's ``allow_partial_load``
is set so its default planner skips them. Nothing is read into those tensors: the state dict returned
holds whatever they held (the model's values when the sharded state dict came from the model).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)


def missing_keys(planner: Any) -> list[str]:
    """Keys the planner was asked to load that its checkpoint metadata does not hold."""
    present = planner.metadata.state_dict_metadata
    requested = {tensor.key for tensor in planner.shapes_validation_sharded_tensors}
    requested.update(planner.allow_shape_mismatch_sharded_tensors or {})
    return sorted(key for key in requested if key not in present)


def wrap_create_local_plan(original: Callable[..., Any]) -> Callable[..., Any]:
    """``create_local_plan`` that plans only the tensors the checkpoint holds."""

    @functools.wraps(original)
    def create_local_plan(self: Any) -> Any:
        missing = missing_keys(self)
        if missing:
            logger.warning("patchkit: %d tensor(s) are not in the checkpoint and keep their values: %s",
                           len(missing), ", ".join(missing))
            absent = set(missing)
            self.shapes_validation_sharded_tensors = [
                tensor for tensor in self.shapes_validation_sharded_tensors if tensor.key not in absent]
            if self.allow_shape_mismatch_sharded_tensors:
                self.allow_shape_mismatch_sharded_tensors = {
                    key: tensor for key, tensor in self.allow_shape_mismatch_sharded_tensors.items()
                    if key not in absent}
            self.allow_partial_load = True
        return original(self)

    return create_local_plan
