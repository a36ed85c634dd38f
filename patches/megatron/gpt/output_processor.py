"""``GPTModel.forward(output_processor=..., output_processor_context=...)`` on megatron-core 0.14-0.17.

Declaration module. megatron-core 0.18 added the hook: with a processor, ``_postprocess`` hands the
decoder's hidden states and the output layer (with the shared embedding weight, if tied) to it and
returns what it returns, so a trainer computes log-probs and entropy chunk by chunk without the
``[s, b, vocab]`` logits. The patch gives 0.14-0.17 the same keywords and call, and is native from
0.18. With MTP the call is 0.18's as well: the MTP block, 0.18's MTP loss attached to the main
hidden states, then the processor with the main chunk (``_processor_mtp``).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import GPT_MODEL, MEGATRON_CORE

PATCHES = (
    Patch(
        id="megatron.output_processor",
        self_check="._checks.output_processor:check_output_processor",
        summary=(
            "GPTModel.forward takes output_processor / output_processor_context (0.18's hook) on 0.14-0.17: "
            "the processor gets hidden states and the output layer instead of logits being computed."
        ),
        why=(
            "RL trainers compute log-probs and entropy from the LM head in chunks (fused kernels) to avoid "
            "materialising [s, b, vocab] logits; before 0.18 verl and NeMo-RL replace GPTModel.forward "
            "for it. One hook on every release lets a framework drop that replacement."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/models/gpt/gpt_model.py",
        removal="Remove with support for megatron-core < 0.18 (native from 0.18).",
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="forward-keywords",
                requires={"megatron-core": ">=0.14,<0.18"},
                installs=(Wrap(f"{GPT_MODEL}:GPTModel.forward", "._output_processor:wrap_forward"),),
            ),
            Variant(
                label="native-0.18",
                requires={"megatron-core": ">=0.18,<0.20"},
                native="GPTModel.forward takes output_processor and output_processor_context (0.18+)",
            ),
        ),
    ),
)
