"""``HybridDeviceOptimizer._update_fp32_params_by_new_state`` for megatron-core 0.14-0.19: fp32 parameters skipped.

Upstream (unchanged 0.14.0-0.19.2), run by ``load_state_dict``'s post-hook through
``_sync_hdo_state_to_sub_optimizers``::

    if not self.param_update_in_fp32:
        return
    for param, v in self.state.items():
        fp32_param = self.param_to_fp32_param[param]
        fp32_param.data.copy_(v["master_param"])

``param_to_fp32_param`` holds only parameters that are not fp32 (``_get_sub_optimizer_param_groups``
copies ``param.dtype != torch.float32`` ones), so any fp32 parameter with state raises ``KeyError``.
An fp32 parameter is its own master (``inner_param`` is the parameter itself), so there is nothing
to copy for it. Where every parameter with state has a copy, upstream's method runs as it is;
otherwise the copies that exist are updated and the rest skipped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def wrap_update_fp32_params_by_new_state(original: Callable[[Any], None]) -> Callable[[Any], None]:
    """``_update_fp32_params_by_new_state`` that leaves parameters without an fp32 copy alone."""

    @functools.wraps(original)
    def _update_fp32_params_by_new_state(self: Any) -> None:
        copies = self.param_to_fp32_param
        if not self.param_update_in_fp32 or all(param in copies for param in self.state):
            original(self)
            return
        for param, state in self.state.items():
            fp32_param = copies.get(param)
            if fp32_param is not None:
                fp32_param.data.copy_(state["master_param"])

    return _update_fp32_params_by_new_state
