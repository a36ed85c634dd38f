"""The tiny GPT the tests and the Megatron self-checks share: ``patchkit.patches.megatron._checks._tiny_gpt``."""

from patchkit.patches.megatron._checks._tiny_gpt import (  # noqa: F401
    BATCH_SIZE,
    SEQ_LEN,
    VOCAB_SIZE,
    Batch,
    build_tiny_gpt,
    make_batch,
)

__all__ = ["BATCH_SIZE", "SEQ_LEN", "VOCAB_SIZE", "Batch", "build_tiny_gpt", "make_batch"]
