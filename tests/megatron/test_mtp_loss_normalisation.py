"""Per-token MTP loss normalisation: patchkit's numbers equal upstream 0.17+'s on every release.

How it is proven (a recorded reference, not a cross-environment run): ``make_mtp_loss_fixture.py``
ran against an unpatched megatron-core 0.19.2 and stored, for one set of inputs, the loss each MTP
depth attaches through ``MTPLossAutoScaler`` (``fixtures/mtp_loss_upstream.json``, 1-3 depths,
with and without ``calculate_per_token_loss``). Here the stored inputs are replayed:

- on 0.17+ upstream itself must still attach the stored losses (the fixture is upstream's, and
  0.17/0.18/0.19 agree), and so must the patch, which calls upstream's ``process_mtp_loss``;
- on 0.14-0.16 the patch must attach them too. Upstream 0.14-0.16 attach, with
  ``calculate_per_token_loss``, the per-token loss without 0.17's rescale by
  ``tokens before rolling / tokens after rolling`` per depth; the test shows that is the only
  difference.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest
import torch
from mtp_loss_reference import CASES, FIXTURE, SEQ_LEN, attached_losses, build_model, read_fixture
from packaging.version import Version

import patchkit

MCORE = Version(version("megatron-core"))
TOLERANCE = {"atol": 1e-6, "rtol": 1e-5}

pytestmark = pytest.mark.usefixtures("megatron_cpu", "empty_mtp_tracker")


@pytest.fixture(scope="module")
def reference() -> tuple[dict, dict[str, torch.Tensor], dict]:
    assert FIXTURE.exists(), f"{FIXTURE} missing: run tests/megatron/make_mtp_loss_fixture.py on megatron-core 0.17+"
    return read_fixture()


def _assert_losses_equal(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} depths attached, expected {len(want)}"
    for depth, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(mine, theirs, **TOLERANCE, msg=f"{what}, depth {depth + 1}")


def test_fixture_comes_from_upstream_017_or_later(reference: tuple) -> None:
    meta, _, cases = reference
    assert Version(meta["megatron_core"]) >= Version("0.17")
    assert set(cases) == set(CASES)


@pytest.mark.parametrize(("mtp_num_layers", "calculate_per_token_loss"), CASES)
def test_patched_mtp_losses_equal_upstream_017s(
    reference: tuple, mtp_num_layers: int, calculate_per_token_loss: bool
) -> None:
    _, inputs, cases = reference
    model = build_model(mtp_num_layers, calculate_per_token_loss, inputs["output_weight"])
    with patchkit.applied("megatron.mtp_postprocess"):
        ours = attached_losses(model, inputs)
    _assert_losses_equal(ours, cases[(mtp_num_layers, calculate_per_token_loss)], "patched")


@pytest.mark.parametrize(("mtp_num_layers", "calculate_per_token_loss"), CASES)
def test_upstream_losses_against_the_017_reference(
    reference: tuple, mtp_num_layers: int, calculate_per_token_loss: bool
) -> None:
    _, inputs, cases = reference
    expected = cases[(mtp_num_layers, calculate_per_token_loss)]
    upstream = attached_losses(build_model(mtp_num_layers, calculate_per_token_loss, inputs["output_weight"]), inputs)
    if MCORE >= Version("0.17") or not calculate_per_token_loss:
        _assert_losses_equal(upstream, expected, f"upstream {MCORE}")
        return
    # 0.14-0.16 with calculate_per_token_loss: off by exactly the per-depth rescale 0.17 added.
    mask = inputs["loss_mask"]
    before = mask.sum()
    rescaled = []
    for depth, loss in enumerate(upstream, start=1):
        rolled = torch.cat([mask[:, depth:], torch.zeros(mask.shape[0], depth)], dim=1)
        assert rolled.shape[1] == SEQ_LEN
        rescaled.append(loss * (before / rolled.sum()))
    assert not torch.allclose(upstream[-1], expected[-1], **TOLERANCE), "0.14-0.16 should differ from 0.17+ here"
    _assert_losses_equal(rescaled, expected, f"upstream {MCORE}, rescaled by tokens before / after rolling")
