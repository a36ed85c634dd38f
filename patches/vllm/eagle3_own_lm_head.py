"""vLLM's EAGLE-3 Llama draft with a truncated vocabulary keeps its own ``lm_head`` (vLLM 0.24-0.33).

Declaration only (see docs/writing-patches.md). ``Eagle3LlamaForCausalLM`` builds its ``lm_head`` with
``draft_vocab_size`` rows (its logits reach target ids through the ``d2t`` map) but leaves
``has_own_lm_head`` at ``False`` until ``load_weights`` reads an ``lm_head`` weight. Built without one
(dummy load format, weights refitted later), the draft is given the target's full-vocabulary head by
the V1 proposer (``SpecDecodeBaseProposer._maybe_share_lm_head``) and by the V2 model runner
(``load_eagle_model``'s ``_should_share``). NeMo-RL rewrites ``llama_eagle3.py`` on disk to set
``has_own_lm_head = draft_vocab_size != vocab_size`` after the head is built; here the constructor is
wrapped to do the same.

Every release patchkit claims has the gap: 0.24.0, 0.25.1, 0.29.0 and 0.33.0 set ``has_own_lm_head``
nowhere in ``llama_eagle3.py``, and both proposers share the target's head when it is ``False``.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

PATCHES = (
    Patch(
        id="vllm.eagle3_own_lm_head",
        self_check="._checks.eagle3_own_lm_head:check_eagle3_own_lm_head",
        summary=(
            "vLLM's EAGLE-3 Llama draft whose draft_vocab_size differs from vocab_size declares its own lm_head, "
            "so the speculative-decoding proposer keeps it instead of putting the target's in its place."
        ),
        why=(
            "has_own_lm_head is set only when load_weights reads an lm_head weight; a draft built without one "
            "(dummy load, refitted later) gets the target's full-vocabulary lm_head, which its d2t map does not fit."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/model_executor/models/llama_eagle3.py",
        removal="Drop when Eagle3LlamaForCausalLM sets has_own_lm_head from its vocabulary sizes as it is built.",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                installs=(
                    Wrap("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.__init__",
                         "._eagle3_own_lm_head:wrap_init"),
                ),
                label="draft-vocab-ownership",
            ),
        ),
    ),
)
