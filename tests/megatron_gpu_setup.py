"""Shared set-up of the ``gpu``-marked Megatron tests: an NCCL world of one, and TE-spec twins of local models.

Used by ``tests/megatron``, ``tests/modelopt`` and ``tests/export`` (each conftest re-exports the
fixture). Nothing here runs at import: torch and megatron-core are imported by the functions, so
collecting on a machine without CUDA (CI) costs nothing and the tests skip through their own marks.

* ``megatron_gpu`` (fixture) / :func:`megatron_nccl_world`: ``cuda:0``, a one-rank NCCL process
  group on an in-memory store (no port), Megatron's parallel state (TP=PP=EP=1) and its CUDA RNG tracker seeded
  (1234); torn down after the test. Skips the test without CUDA.
* :data:`REQUIRES_TE`: the skip mark for tests that need a real TransformerEngine (its torch
  extension ``transformer_engine_torch`` built), not ``tests/te_harness.py``'s import stand-in;
  :func:`cuda_and_te_marks`: the marks of a module of such tests on a CUDA GPU.
* :func:`te_twin`: a local-spec ``GPTModel`` rebuilt on ``get_gpt_layer_with_transformer_engine_spec``
  with the same weights. TE fuses a layer norm into the linear after it, so ``input_layernorm.*``
  is ``self_attention.linear_qkv.layer_norm_*`` and ``pre_mlp_layernorm.*`` (dense MLPs)
  ``mlp.linear_fc1.layer_norm_*`` (:data:`FUSED_NORMS`).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
from _multiprocess import single_process_group

#: (local-spec name part, TE-spec name part) of the layer norms TE fuses into the following linear.
FUSED_NORMS = ((".input_layernorm.", ".self_attention.linear_qkv.layer_norm_"),
               (".pre_mlp_layernorm.", ".mlp.linear_fc1.layer_norm_"))

REQUIRES_TE = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None
    or importlib.util.find_spec("transformer_engine_torch") is None,
    reason="needs a real TransformerEngine (transformer_engine_torch)",
)


def cuda_and_te_marks(*more: pytest.MarkDecorator) -> list[pytest.MarkDecorator]:
    """``pytestmark`` of a module whose tests run TransformerEngine layers on a CUDA GPU: marker ``gpu``,
    skipped without CUDA or without a real TransformerEngine (:data:`REQUIRES_TE`), then ``more``."""
    import torch

    return [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
            REQUIRES_TE, *more]


@contextlib.contextmanager
def megatron_nccl_world() -> Iterator[None]:
    """Megatron's parallel state on a one-rank NCCL group on ``cuda:0``; destroyed on exit."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.cuda.set_device(0)
    if not torch.distributed.is_initialized():
        single_process_group("nccl")
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1234)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


@pytest.fixture
def megatron_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """:func:`megatron_nccl_world` for one test; skipped without CUDA."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from megatron.core.transformer.moe import moe_utils

    # megatron-core releases without TE's grouped GEMM hook lack the name their MoE code reads.
    if not hasattr(moe_utils, "te_general_gemm"):
        monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    with megatron_nccl_world():
        yield


def te_twin(local: Any, **spec_kwargs: Any) -> Any:
    """``local`` (a local-spec ``GPTModel``, MTP layers included) rebuilt on TE's layer spec on CUDA,
    every parameter copied from ``local`` (fused layer norms renamed). ``spec_kwargs`` go to
    ``get_gpt_layer_with_transformer_engine_spec`` (``num_experts``, ``moe_grouped_gemm``...).
    Buffers (an MoE router's expert bias) are the caller's to copy."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_with_transformer_engine_spec,
        get_gpt_mtp_block_spec,
    )

    spec = get_gpt_layer_with_transformer_engine_spec(**spec_kwargs)
    mtp = (get_gpt_mtp_block_spec(local.config, spec, use_transformer_engine=True)
           if local.config.mtp_num_layers else None)
    twin = GPTModel(local.config, spec, vocab_size=local.vocab_size, max_sequence_length=local.max_sequence_length,
                    mtp_block_spec=mtp).cuda()
    source = {n: p.detach() for n, p in local.named_parameters()}
    used = set()
    with torch.no_grad():
        for name, param in twin.named_parameters():
            key = name
            for local_part, te_part in FUSED_NORMS:
                key = key.replace(te_part, local_part)
            assert key in source, f"no local weight for {name}"
            assert source[key].shape == param.shape, name
            param.copy_(source[key])
            used.add(key)
    assert used == set(source), sorted(set(source) - used)
    return twin
