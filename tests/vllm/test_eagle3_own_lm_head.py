"""``vllm.eagle3_own_lm_head``: vLLM's EAGLE-3 Llama draft with a truncated vocabulary keeps its own ``lm_head``.

Upstream truth: vLLM's own ``Eagle3LlamaForCausalLM`` and target ``LlamaForCausalLM`` (tiny configs, built
on CPU from vLLM's ``ModelConfig`` and ``SpeculativeConfig``, no weights loaded, as with a dummy load
format), vLLM's V1 ``EagleProposer`` built for that config (its ``_maybe_share_lm_head``, which
``load_model`` calls after loading the draft) and the V2 model runner's ``_should_share`` (what
``load_eagle_model`` asks). Without the patch a 64-token draft over a 256-token target loses its head to
the target's; with it the draft keeps its 64-row head, and a full-vocabulary draft still shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from patchkit.patches.vllm._checks import _eagle3_draft
from vllm_fixtures import installed

from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import upstream_behaviour

PATCH = "vllm.eagle3_own_lm_head"
# The doctor applies what applies in its process: what it installs is reverted after each test.
pytestmark = pytest.mark.usefixtures("patches_restored")
DRAFT_VOCAB = 64
VOCAB = _eagle3_draft.TARGET_CONFIG["vocab_size"]


@pytest.fixture(scope="module")
def configs(vllm_config: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """EAGLE-3 configs for a truncated (64-token) and a full-vocabulary (256-token) draft."""
    directory = tmp_path_factory.mktemp("eagle3")
    return {size: _eagle3_draft.eagle3_vllm_config(vllm_config.model_config, Path(directory) / f"draft-{size}", size)
            for size in (DRAFT_VOCAB, VOCAB)}


@pytest.fixture(scope="module")
def target(configs: dict[int, Any]) -> Any:
    return _eagle3_draft.llama_target(configs[DRAFT_VOCAB])


def test_upstream_gives_a_truncated_draft_the_target_s_full_vocabulary_head(configs, target):
    draft = _eagle3_draft.eagle3_draft(configs[DRAFT_VOCAB])
    assert draft.lm_head.weight.shape[0] == DRAFT_VOCAB
    assert draft.has_own_lm_head is False
    assert _eagle3_draft.v2_runner_shares(draft, target)
    assert _eagle3_draft.v1_proposer_shares(configs[DRAFT_VOCAB], draft, target)
    assert draft.lm_head.weight.shape[0] == VOCAB


@pytest.mark.breaks("vllm.eagle3_own_lm_head")
def test_a_truncated_draft_keeps_its_own_head(configs, target):
    with installed(PATCH):
        draft = _eagle3_draft.eagle3_draft(configs[DRAFT_VOCAB])
    own_head = draft.lm_head

    assert draft.has_own_lm_head is True
    assert not _eagle3_draft.v2_runner_shares(draft, target)
    assert not _eagle3_draft.v1_proposer_shares(configs[DRAFT_VOCAB], draft, target)
    assert draft.lm_head is own_head and draft.lm_head.weight.shape[0] == DRAFT_VOCAB
    assert draft.draft_id_to_target_id.shape[0] == DRAFT_VOCAB


def test_a_full_vocabulary_draft_still_shares_the_target_s_head(configs, target):
    with installed(PATCH):
        draft = _eagle3_draft.eagle3_draft(configs[VOCAB])

    assert draft.has_own_lm_head is False
    assert _eagle3_draft.v2_runner_shares(draft, target)
    assert _eagle3_draft.v1_proposer_shares(configs[VOCAB], draft, target)


def test_an_lm_head_weight_read_later_still_marks_the_head_as_the_draft_s_own(configs):
    from vllm.model_executor.models.utils import process_eagle_weight

    with installed(PATCH):
        draft = _eagle3_draft.eagle3_draft(configs[VOCAB])
    process_eagle_weight(draft, "lm_head.weight")  # what load_weights does for each weight it reads

    assert draft.has_own_lm_head is True


def test_eagle3_own_lm_head_check_is_verified(vllm_config):
    with installed(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.eagle3_own_lm_head")
def test_eagle3_own_lm_head_check_fails_with_upstream_s_constructor(vllm_config):
    with installed(PATCH), upstream_behaviour(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "has_own_lm_head of a 64-token draft over a 256-token target: expected True, found False" \
        in verdict.message, verdict.message
