"""Hugging Face module-name patterns rewritten as Megatron-Core module-name patterns.

Pure string work (no torch): users write QAT ignore lists in the names of the checkpoint they know
(``lm_head``, ``*mlp.gate``, ``*self_attn*``); ModelOpt matches its wildcards against the Megatron
model's quantizer names (``output_layer.weight_quantizer``, ``decoder.layers.0.mlp.router...``).
The table below follows the names Megatron-Bridge's GPT mappings use (``model.layers.*`` to
``decoder.layers.*``, ``q/k/v_proj`` fused into ``linear_qkv``, ``gate/up_proj`` into ``linear_fc1``).
"""

from __future__ import annotations

import re
from typing import Iterable

# Token boundaries: a name token ends at '.', '*', '?', '[' or the end of the pattern, so
# 'gate_proj' is not rewritten inside 'my_gate_proj_x' and 'mlp.gate' not inside 'mlp.gate_proj'.
_END = r"(?![A-Za-z0-9_])"
_START = r"(?<![A-Za-z0-9_])"

#: (HF regex, Megatron replacement), applied in order: longer names before their prefixes.
HF_TO_MEGATRON: tuple[tuple[str, str], ...] = (
    (rf"{_START}lm_head{_END}", "output_layer"),
    (rf"{_START}model\.embed_tokens{_END}", "embedding.word_embeddings"),
    (rf"{_START}embed_tokens{_END}", "embedding.word_embeddings"),
    (rf"{_START}model\.norm{_END}", "decoder.final_layernorm"),
    (rf"{_START}model\.layers{_END}", "decoder.layers"),
    (rf"{_START}self_attn{_END}", "self_attention"),
    (rf"{_START}(?:q_proj|k_proj|v_proj|qkv_proj){_END}", "linear_qkv"),
    (rf"{_START}o_proj{_END}", "linear_proj"),
    (rf"{_START}(?:gate_up_proj|gate_proj|up_proj){_END}", "linear_fc1"),
    (rf"{_START}down_proj{_END}", "linear_fc2"),
    (rf"{_START}mlp\.shared_expert_gate{_END}", "mlp.shared_experts.gate_weight"),
    (rf"{_START}mlp\.shared_expert{_END}", "mlp.shared_experts"),
    # The MoE router is 'mlp.gate' in Qwen/DeepSeek-style HF checkpoints.
    (rf"{_START}mlp\.gate{_END}", "mlp.router"),
    (rf"{_START}block_sparse_moe\.gate{_END}", "mlp.router"),
    (rf"{_START}block_sparse_moe{_END}", "mlp"),
)

_COMPILED = tuple((re.compile(hf), megatron) for hf, megatron in HF_TO_MEGATRON)


def hf_pattern_to_megatron(pattern: str) -> str:
    """Rewrite one fnmatch pattern from HF module names to Megatron quantizer names.

    A pattern that names a module (no trailing wildcard) gets ``.*`` appended so that it matches the
    quantizers ModelOpt attaches under that module (``output_layer.weight_quantizer``). Megatron
    names pass through unchanged, so patterns already written for Megatron keep working.
    """
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError(f"ignore pattern must be a non-empty string, got {pattern!r}")
    rewritten = pattern.strip()
    for regex, replacement in _COMPILED:
        rewritten = regex.sub(replacement, rewritten)
    if rewritten.endswith("."):  # 'mlp.gate.' (verl's form): anything under that module
        rewritten += "*"
    if not rewritten.endswith("*"):
        rewritten += ".*"
    return rewritten


def hf_patterns_to_megatron(patterns: "list[str] | tuple[str, ...]") -> dict[str, str]:
    """``{user pattern: Megatron pattern}``, in the order given, duplicates dropped."""
    if isinstance(patterns, str):
        patterns = (patterns,)
    return {pattern: hf_pattern_to_megatron(pattern) for pattern in patterns}


def resolve_ignore(
    ignore: "Iterable[str] | str | None", ignore_patterns: "Iterable[str] | str | None"
) -> tuple[str, ...]:
    """The ignore patterns from ``ignore`` or verl's keyword ``ignore_patterns`` (not both); ``None`` is none.

    Read once, so generators work; a single string is one pattern, not its characters.
    """
    if ignore_patterns is not None:
        if ignore:
            raise TypeError("pass ignore patterns as 'ignore' or as 'ignore_patterns', not both")
        ignore = ignore_patterns
    if ignore is None:
        return ()
    return (ignore,) if isinstance(ignore, str) else tuple(ignore)
