"""Fixtures for tests against the real megatron-core on CPU (see ``cpu_harness``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")  # before torch: without torch the folder is skipped, not an error
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cpu_harness import megatron_state_on_cpu  # noqa: E402
from megatron_gpu_setup import megatron_gpu  # noqa: E402,F401  (the GPU tests' fixture)
from tiny_gpt import Batch, build_tiny_gpt, make_batch  # noqa: E402


@pytest.fixture
def megatron_cpu() -> Iterator[None]:
    """Megatron parallel state (TP=PP=CP=1) on a one-rank gloo group, CUDA-only calls redirected."""
    with megatron_state_on_cpu():
        yield


@pytest.fixture
def moe_replay(megatron_cpu: None) -> Iterator[dict[str, Any]]:
    """CPU MoE harness with the router replay patches applied (reverted after): statuses by id.

    Replay state and the replay policy are reset before and restored after, so no test sees
    another's recorded indices or policy.
    """
    from moe_harness import cpu_moe
    from patchkit.patches.megatron import router_replay as replay
    from replay_models import REPLAY_PATCH_IDS

    import patchkit

    with cpu_moe(), patchkit.applied(*REPLAY_PATCH_IDS) as statuses:
        replay.reset()
        defaults = replay.policy()
        try:
            yield {status.id: status for status in statuses}
        finally:
            replay.set_policy(**defaults)
            replay.reset()


@pytest.fixture
def batch() -> Batch:
    return make_batch()


@pytest.fixture
def tiny_gpt(megatron_cpu: None) -> Callable[..., Any]:
    """Factory for tiny GPT models; needs (and requests) the CPU Megatron environment."""
    return build_tiny_gpt


@pytest.fixture
def empty_mtp_tracker() -> Iterator[None]:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossLoggingHelper.tracker.clear()
    yield
    MTPLossLoggingHelper.tracker.clear()


@pytest.fixture
def attached_mtp_losses() -> Iterator[list[torch.Tensor]]:
    """Every loss tensor handed to ``MTPLossAutoScaler.apply``, in call order (upstream's or ours)."""
    from mtp_loss_reference import recording_attached_losses

    with recording_attached_losses() as recorded:
        yield recorded
