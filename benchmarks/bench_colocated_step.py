"""The whole colocated step, QAT export streamed into vLLM's refit, against a plain device copy of the same bytes.

One process, one GPU, as a colocated RL job runs it: a Megatron GPT (megatron-core, local layer
spec, bf16) with ModelOpt NVFP4 W4A16 QAT applied (its CUDA kernel), and a vLLM model made of vLLM
0.24's own ModelOpt NVFP4 linear layers at the export's names (``tests/e2e/serving.py``), started with
``load_format="dummy"`` and processed by vLLM (Marlin on Hopper). Timed, both sides in the same run:

- **step**: ``refit_weights(serving, export_qat_weights([model]))``: per tensor, gather (TP=1),
  quantize and pack (the fused Triton kernel), then vLLM's loaders, processing (Marlin repack) and
  the copy into the kept kernel tensors;
- **export**: the export stream alone, drained;
- **copy**: ``dst.copy_(src)`` of every parameter of the Megatron model into preallocated buffers on the
  same device: the bytes the step reads, moved by the cheapest device operation.

Throughput is the model's bf16 bytes per second on each side; the figure is ``step GB/s`` and its ratio
to the copy. It also checks that the refits reallocate no kernel tensor. Run on a GPU machine with
vLLM's kernels (docs/verification.md, "What ran on a GPU")::

    python benchmarks/bench_colocated_step.py [--layers 20] [--hidden 4096] [--ffn 14336] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from _options import integer_options

TESTS = Path(__file__).resolve().parent.parent / "tests"
for folder in ("vllm", "e2e"):
    sys.path.insert(0, str(TESTS / folder))


def start_both(model_dir: Path) -> Any:
    """One NCCL world of one rank; vLLM's model-parallel state and Megatron's built on it."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm_cpu_harness import TINY_LLAMA_CONFIG

    # A file store in the run's own temporary folder: no port to pick ahead and lose to another process.
    # vLLM finds the group already made and does not open the store again.
    method = f"file://{(model_dir / 'store').resolve()}"
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", init_method=method, rank=0, world_size=1)
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = VllmConfig(model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16"))
    context = set_current_vllm_config(config)
    context.__enter__()
    init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=method, backend="nccl")
    initialize_model_parallel(1, 1)
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1234)
    return config


def trainer_model(args: argparse.Namespace) -> torch.nn.Module:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, ffn_hidden_size=args.ffn, num_attention_heads=args.heads,
        num_query_groups=args.groups, gated_linear_unit=True, add_bias_linear=False, params_dtype=torch.bfloat16,
        bf16=True, hidden_dropout=0.0, attention_dropout=0.0,
    )
    torch.manual_seed(0)
    return GPTModel(config, get_gpt_layer_local_spec(), vocab_size=args.vocab, max_sequence_length=4096,
                    share_embeddings_and_output_weights=False).cuda()


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = integer_options(__doc__, layers=20, hidden=4096, ffn=14336, heads=32, groups=8, vocab=32000, repeat=3)
    args = parser.parse_args()

    import vllm
    import vllm.model_executor.layers.quantization.modelopt  # noqa: F401  (so the refit patch installs now)

    import patchkit

    (record,) = patchkit.apply("vllm.nvfp4_refit")
    assert record.state.installed, record.to_dict()
    from gpu_kernels import kernel_tensors
    from nvfp4_helpers import dummy_started
    from patchkit.patches.modelopt.qat import apply_qat, export_qat_weights
    from patchkit.patches.vllm.refit import refit_weights
    from serving import ServingModel, with_input_scales

    with tempfile.TemporaryDirectory() as tmp:
        vllm_config = start_both(Path(tmp))
        model = trainer_model(args)
        apply_qat(model, backend=None)
        params = [p.detach() for p in model.parameters()]
        total = sum(p.numel() * p.element_size() for p in params)
        shapes = {n: (t.shape, t.dtype) for n, t in with_input_scales(export_qat_weights([model]), 1.0)}
        with torch.device("cuda"):
            serving = dummy_started(ServingModel(shapes, "NVFP4", torch.bfloat16), vllm_config)
        before = kernel_tensors(serving)
        buffers = [torch.empty_like(p) for p in params]

        def copy() -> None:
            for dst, src in zip(buffers, params, strict=True):
                dst.copy_(src)

        def export_only() -> None:
            for _name, _tensor in export_qat_weights([model]):
                pass

        def step() -> None:
            refit_weights(serving, with_input_scales(export_qat_weights([model]), 1.0))

        step()  # warm-up: first-call imports, Triton compilation, staging parameters
        copy()
        copy_s = timed(copy, 10)
        export_s = timed(export_only, args.repeat)
        step_s = timed(step, args.repeat)
        moved = sorted(n for n, ptr in kernel_tensors(serving).items() if before.get(n) != ptr)
        gb = total / 1e9
        first_linear = serving.get_submodule(serving.linears[0])
        med = {k: statistics.median(v) for k, v in (("copy", copy_s), ("export", export_s), ("step", step_s))}
        result = {
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "vllm": vllm.__version__,
            "layers": args.layers, "hidden": args.hidden, "ffn": args.ffn, "vocab": args.vocab,
            "bf16_gb": round(gb, 3), "tensors_exported": len(shapes),
            "linear_kernel": type(getattr(first_linear.quant_method, "kernel", None)).__name__,
            "copy_s": round(med["copy"], 5), "export_s": round(med["export"], 4), "step_s": round(med["step"], 4),
            "copy_gb_s": round(gb / med["copy"], 1), "export_gb_s": round(gb / med["export"], 1),
            "step_gb_s": round(gb / med["step"], 1), "step_vs_copy": round(med["copy"] / med["step"], 4),
            "export_vs_copy": round(med["copy"] / med["export"], 4), "all_step_s": [round(t, 4) for t in step_s],
            "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1),
            "kernel_tensors": len(before), "reallocated": moved,
        }
        print(json.dumps(result))
        if moved:
            raise SystemExit(f"refit reallocated {len(moved)} kernel tensors")


if __name__ == "__main__":
    main()
