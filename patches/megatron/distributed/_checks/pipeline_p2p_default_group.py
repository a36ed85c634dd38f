"""Self-check of ``megatron.pipeline_p2p_default_group``: upstream's ``P2PCommunicator`` on a pipeline
group of its own builds every batched send and receive on the default group.

One process has no pipeline peer to exchange with (gloo sends nothing to itself), so the check records
the ops ``torch.distributed.batch_isend_irecv`` is given instead of sending them; the tests exchange
real tensors between two processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from patchkit.selfcheck import CheckContext, expect

from ...dist_checkpointing._checks._roundtrip import one_rank_gloo, without_cuda

SHAPE = (2, 1, 3)  # (sequence, micro-batch, hidden), as the shape exchange sends it


@contextlib.contextmanager
def recording_batched_p2p(send: bool = True) -> Iterator[list[Any]]:
    """Every ``P2POp`` given to ``torch.distributed.batch_isend_irecv`` in the block; with ``send``
    false they are recorded only (no request is started)."""
    ops: list[Any] = []
    batch_isend_irecv = torch.distributed.batch_isend_irecv

    def recording(op_list: list[Any]) -> list[Any]:
        ops.extend(op_list)
        return batch_isend_irecv(op_list) if send else []

    with mock.patch.object(torch.distributed, "batch_isend_irecv", recording):
        yield ops


def pipeline_config(**overrides: Any) -> Any:
    """A two-stage pipeline config with batched p2p (upstream's default), float32 activations."""
    from megatron.core import ModelParallelConfig

    return ModelParallelConfig(**{"pipeline_model_parallel_size": 2, "pipeline_dtype": torch.float32,
                                  "batch_p2p_comm": True, **overrides})


def ops_groups(ops: list[Any]) -> list[str]:
    """``"default"`` or ``"other"`` for each op's process group (while the default group exists)."""
    default = torch.distributed.group.WORLD
    return ["default" if op.group is default else "other" for op in ops]


def check_pipeline_p2p_default_group(context: CheckContext) -> None:
    """A send to the next stage and a receive from the previous one, shapes then tensors, through
    upstream's ``P2PCommunicator`` on a pipeline group distinct from the default group: every op is
    built on the default group (upstream builds the tensor ops, and from 0.16 the shape ops, on the
    pipeline group)."""
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    with one_rank_gloo(), without_cuda():
        pipeline_group = torch.distributed.new_group([0])
        communicator = P2PCommunicator(pipeline_group, pipeline_config())
        with recording_batched_p2p(send=False) as ops:
            # The shape exchange of variable_seq_lengths, then the tensors (their shape given).
            communicator._communicate_shapes(tensor_send_next=torch.ones(SHAPE), tensor_send_prev=None,
                                             recv_prev=True, recv_next=False)
            communicator._communicate(tensor_send_next=torch.ones(SHAPE), tensor_send_prev=None, recv_prev=True,
                                      recv_next=False, tensor_shape=SHAPE)
        groups = ops_groups(ops)
        torch.distributed.destroy_process_group(pipeline_group)
    expect(len(groups) == 4 and set(groups) == {"default"},
           "the batched sends and receives of shapes and tensors are built on the default group",
           ["default"] * 4, groups)
