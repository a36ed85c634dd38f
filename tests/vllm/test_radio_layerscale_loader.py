"""``vllm.radio_layerscale_loader``: vLLM's ``RadioModel`` loads the checkpoint's LayerScale (``ls1``/``ls2``).

Upstream truth: vLLM's own ``RadioModel`` (tiny: two encoder layers of width 32, ``initializer_factor``
0.25), built on CPU, every parameter randomised first as vLLM's dummy load leaves it (how an RL rollout
engine starts before its first weight sync), then loaded through ``RadioModel.load_weights`` with RADIO
checkpoint names. Upstream skips the LayerScale entries, so the parameters keep their dummy values; with
the patch they hold the checkpoint's values (``ls1`` or timm's ``ls1.gamma``), or ``initializer_factor``
where the checkpoint has none (folded), and a weight sync split over several calls keeps what an earlier
call loaded. Every other parameter is loaded by upstream's code, with or without the patch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from patchkit.patches.vllm._checks._tiny_radio import (
    INITIALIZER_FACTOR,
    checkpoint,
    checkpoint_value,
    layerscale_names,
    randomise,
    tiny_radio_model,
)

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import State
from patchkit.selfcheck import upstream_behaviour

PATCH = "vllm.radio_layerscale_loader"
pytestmark = pytest.mark.usefixtures("patches_restored")


@pytest.fixture
def dummy_model(vllm_config: Any) -> Iterator[Any]:
    """A tiny vLLM ``RadioModel`` whose parameters hold random (dummy-load) values."""
    model = tiny_radio_model()
    randomise(model, seed=0)
    yield model


def values(model: Any) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def test_patch_is_applied_on_this_release():
    with patchkit.applied(PATCH) as (record,):
        assert record.state is State.APPLIED, record.to_dict()


@pytest.mark.parametrize("spelling", ["plain", "gamma"])
def test_layerscale_comes_from_the_checkpoint(applied, dummy_model, spelling):
    entries = checkpoint(dummy_model, layerscale=spelling)
    loaded = dummy_model.load_weights(entries)
    after = values(dummy_model)
    for name in layerscale_names():
        assert torch.equal(after[name], checkpoint_value(entries, name)), name
    assert set(layerscale_names()) <= loaded


def test_layerscale_absent_from_the_checkpoint_is_the_initializer_factor(applied, dummy_model):
    loaded = dummy_model.load_weights(checkpoint(dummy_model, layerscale=None))
    after = values(dummy_model)
    for name in layerscale_names():
        assert torch.equal(after[name], torch.full_like(after[name], INITIALIZER_FACTOR)), name
    assert set(layerscale_names()) <= loaded


def test_every_other_parameter_is_loaded_as_upstream_loads_it(vllm_config):
    """The same checkpoint into two models with the same dummy values: upstream's loader and the patched one
    write the same values to, and report the same names for, every parameter but LayerScale."""
    upstream, patched = tiny_radio_model(), tiny_radio_model()
    randomise(upstream, seed=0)
    randomise(patched, seed=0)
    entries = checkpoint(upstream, layerscale="plain")
    upstream_loaded = upstream.load_weights(entries)
    with patchkit.applied(PATCH):
        patched_loaded = patched.load_weights(entries)
    others = [name for name in values(upstream) if name not in layerscale_names()]
    assert others
    for name in others:
        assert torch.equal(values(upstream)[name], values(patched)[name]), name
    assert patched_loaded - set(layerscale_names()) == upstream_loaded


def test_a_sync_split_over_calls_keeps_layerscale_loaded_earlier(applied, dummy_model):
    """Layer 0's LayerScale in the first call, the rest of the checkpoint in the second: the second call
    does not reset layer 0's values to the initializer factor."""
    entries = checkpoint(dummy_model, layerscale="plain")
    first = {name: value for name, value in entries.items() if ".blocks.0.ls" in name}
    dummy_model.load_weights(first)
    dummy_model.load_weights({name: value for name, value in entries.items() if name not in first})
    after = values(dummy_model)
    for name in layerscale_names():
        assert torch.equal(after[name], checkpoint_value(entries, name)), name


def test_a_generator_of_entries_is_accepted(applied, dummy_model):
    entries = checkpoint(dummy_model, layerscale="plain")
    dummy_model.load_weights(iter(entries.items()))
    after = values(dummy_model)
    for name in layerscale_names():
        assert torch.equal(after[name], checkpoint_value(entries, name)), name


def test_upstream_keeps_the_dummy_layerscale(dummy_model):
    """What the patch fixes, on this release: without it LayerScale keeps the dummy values whether the
    checkpoint has it or not."""
    dummy = values(dummy_model)
    dummy_model.load_weights(checkpoint(dummy_model, layerscale="plain"))
    after = values(dummy_model)
    for name in layerscale_names():
        assert torch.equal(after[name], dummy[name]), name


def test_radio_layerscale_check_is_verified(applied):
    (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.radio_layerscale_loader")
def test_radio_layerscale_check_fails_with_upstreams_loader(applied):
    with upstream_behaviour(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert ("RADIO LayerScale parameters loaded from a checkpoint that has them: expected all equal to the "
            "checkpoint's, found differing: ['model.encoder.layers.0.ls1'") in verdict.message, verdict.message
