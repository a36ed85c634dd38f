"""``_batched_p2p_ops`` that builds its ``P2POp``s without a group: on the default process group.

Upstream passes the pipeline group it is given to each ``torch.distributed.P2POp``; ``P2POp`` given no
group uses the default one. The peers (``prev_pipeline_rank``, ``next_pipeline_rank``) are global ranks
(``P2PCommunicator`` maps them with ``get_global_rank``), which is what the default group addresses.
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
