"""Tensor-parallel gradient all-reduces in chunks of bounded size (megatron-core 0.14-0.19).

Declaration module. ``finalize_model_grads`` calls ``_allreduce_non_tensor_model_parallel_grads``
(``distributed/finalize_model_grads.py``), which all-reduces, across the tensor-parallel group, the
gradients every tensor-parallel rank holds whole: sequence-parallel layer norms, q/k layer norms,
parameters marked ``average_gradients_across_tp_domain``. It flattens all of them into one buffer
(``_flatten_dense_tensors``) for one all-reduce per reduction op: a second copy of every such
gradient, in one contiguous allocation, which can fail under a fragmented allocator on large models.
slime replaces the function with a copy that coalesces in chunks
(``slime/backends/megatron_utils/megatron_patch/megatron_chunked_grad_coalesce_patch.py``,
``SLIME_GRAD_COALESCE_CHUNK_BYTES``, default 1 GiB).

With the patch, the same function runs upstream's body once per chunk of parameters: each call sees
only the parameters of its chunk, so each all-reduce carries at most the chunk (a single gradient
larger than the chunk is reduced alone). SUM and AVG are element-wise, so the gradients are the ones
the single all-reduce gives. Opt-in; the chunk is ``PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES`` (default
1 GiB) or :func:`._chunked_tp_grad_allreduce.configure_chunk_bytes`.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_FINALIZE = "megatron.core.distributed.finalize_model_grads"

PATCHES = (
    Patch(
        id="megatron.chunked_tp_grad_allreduce",
        self_check="._checks.chunked_tp_grad_allreduce:check_chunked_tp_grad_allreduce",
        summary=(
            "finalize_model_grads all-reduces the tensor-parallel-replicated gradients (layer norms, "
            "averaged parameters) in chunks of at most PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES (1 GiB)."
        ),
        why=(
            "Upstream coalesces every such gradient into one flat buffer per all-reduce, a second copy "
            "in one allocation that can run out of memory on large models; slime replaces the function "
            "with a chunked copy."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"
            "megatron/core/distributed/finalize_model_grads.py"
        ),
        removal="Remove once upstream bounds the coalesced buffer (not in 0.19).",
        opt_in=True,
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(f"{_FINALIZE}:_allreduce_non_tensor_model_parallel_grads",
                         "._chunked_tp_grad_allreduce:wrap_allreduce"),
                ),
            ),
        ),
    ),
)
