"""``mtp.enable`` on the models RL frameworks hand it, against the real megatron-core (CPU).

A vision-language model holds its ``GPTModel`` as ``.language_model`` (megatron's own multimodal
models, and verl's MTP patch looks there for the model it patches), usually under a ``.module``
wrapper (DDP, ``Float16Module``): ``mtp.enable`` / ``mtp.disable`` find it there too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from mtp_checks import assert_output_head_untouched_and_mtp_trains, run
from tiny_gpt import VOCAB_SIZE, Batch

pytestmark = pytest.mark.usefixtures("empty_mtp_tracker")


class VisionLanguageModel(torch.nn.Module):
    """The shape of a multimodal model: an encoder beside the language model it feeds."""

    def __init__(self, language_model: torch.nn.Module) -> None:
        super().__init__()
        self.vision_model = torch.nn.Linear(4, 4)
        self.language_model = language_model


class Wrapper(torch.nn.Module):
    """DDP / ``Float16Module``: the model under ``.module``."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def test_enable_finds_the_language_model_of_a_wrapped_vision_language_model(
    tiny_gpt: Callable[..., Any], batch: Batch
) -> None:
    from megatron.core.models.gpt.gpt_model import GPTModel
    from patchkit.patches.megatron import mtp

    gpt = tiny_gpt(mtp_num_layers=1)
    class_postprocess = GPTModel.__dict__["_postprocess"]

    assert mtp.enable([Wrapper(VisionLanguageModel(gpt))]) == [gpt]
    assert GPTModel.__dict__["_postprocess"] is class_postprocess  # the class is untouched
    logits = run(gpt, batch)
    assert logits.shape == (*batch.labels.shape, VOCAB_SIZE)  # logits with labels: the patch is bound
    (logits * 0.0).sum().backward()
    assert_output_head_untouched_and_mtp_trains(gpt)


def test_disable_finds_the_language_model_of_a_vision_language_model(tiny_gpt: Callable[..., Any]) -> None:
    from patchkit.patches.megatron import mtp

    gpt = tiny_gpt(mtp_num_layers=1)
    vlm = VisionLanguageModel(gpt)
    mtp.enable(vlm)
    assert "_postprocess" in vars(gpt)
    assert mtp.disable(vlm) == [gpt]
    assert "_postprocess" not in vars(gpt)
    assert not mtp.options_for(gpt).enabled


def test_a_model_without_a_language_model_is_still_refused(megatron_cpu: None) -> None:
    from patchkit.patches.megatron import mtp

    with pytest.raises(mtp.MTPModelError, match="language_model"):
        mtp.enable(VisionLanguageModel(torch.nn.Linear(2, 2)))
    with pytest.raises(mtp.MTPModelError, match="GPTModel"):
        mtp.enable(Wrapper(torch.nn.Linear(2, 2)))
