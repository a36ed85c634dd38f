"""Self-check of ``vllm.eagle3_own_lm_head``: a truncated EAGLE-3 draft keeps its own ``lm_head``."""

from __future__ import annotations

import tempfile
from pathlib import Path

from patchkit.selfcheck import CheckContext, expect

from . import _eagle3_draft
from ._cpu_stand_in import vllm_context


def check_eagle3_own_lm_head(context: CheckContext) -> None:
    """A draft of 64 tokens over a 256-token target declares its own head, and vLLM's V1 proposer keeps it;
    a full-vocabulary draft keeps upstream's default (share the target's head)."""
    with vllm_context("cpu"), tempfile.TemporaryDirectory() as scratch:
        model_config = _eagle3_draft.target_model_config(Path(scratch) / "target")
        truncated = _eagle3_draft.eagle3_vllm_config(model_config, Path(scratch) / "draft-64", 64)
        draft = _eagle3_draft.eagle3_draft(truncated)
        target = _eagle3_draft.llama_target(truncated)
        own_head = draft.lm_head
        expect(draft.has_own_lm_head is True, "has_own_lm_head of a 64-token draft over a 256-token target",
               True, draft.has_own_lm_head)
        expect(not _eagle3_draft.v1_proposer_shares(truncated, draft, target) and draft.lm_head is own_head,
               "vLLM's EagleProposer keeps the draft's own 64-row lm_head", "kept", "replaced by the target's")
        full = _eagle3_draft.eagle3_vllm_config(model_config, Path(scratch) / "draft-256", 256)
        full_draft = _eagle3_draft.eagle3_draft(full)
        expect(full_draft.has_own_lm_head is False, "has_own_lm_head of a full-vocabulary draft", False,
               full_draft.has_own_lm_head)
