"""vLLM ModelOpt NVFP4 layers on a GPU with vLLM's own CUDA kernels, for the ``gpu``-marked tests.

Shared by ``test_marlin_w4a16_gpu.py``, ``test_refit_gpu.py`` and ``test_fp8_refit_gpu.py``: the
module marks (``GPU``), patches applied for one test (``installed``), a CUDA graph of a forward
(``capture``/``replay``), the layers, checkpoints and references. Sizes suit Marlin (output
features a multiple of 64, input features a multiple of 128). The references use no vLLM code: the
checkpoint is dequantised by ``_nvfp4_checkpoint.dequantize`` and multiplied in float32.

The bound: Marlin multiplies bf16 activations by the weight dequantised to bf16, accumulates in
float32 and rounds the output to bf16. Each of those roundings is at most 2^-8 relative, so per output
element ``|out - ref| <= 2^-7 * (|x| @ |W|^T) + 2^-8 * |ref|`` (``ref`` the float32 product of the
same bf16 activations and the exactly dequantised weight). The MoE layer adds SiLU-and-multiply of
two such products and a second GEMM on the bf16 result; its bound is ``2^-6`` times the same
expression taken on absolute values through both GEMMs, plus ``2^-8 * |ref|``.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
from collections.abc import Callable, Iterator

import pytest
import torch
from moe_helpers import load_experts_by_mapping
from nvfp4_helpers import dequantize, export_nvfp4, items, process_weights_after_loading
from vllm_fixtures import installed  # noqa: F401  (the GPU tests import it from here)

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 256, 512, 4, 2
MOE_INTERMEDIATE = 256

logger = logging.getLogger(__name__)

_model_numbers = itertools.count()

#: ``pytestmark`` of every test module here: marker ``gpu``, skipped without CUDA.
GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (vLLM's compiled kernels)"),
]

Outputs = tuple[torch.Tensor, ...]


def capture(forward: Callable[[], Outputs]) -> tuple[torch.cuda.CUDAGraph, Outputs]:
    """A CUDA graph of ``forward`` (warmed up on a side stream, as vLLM's runner does) and its outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = forward()
    return graph, outputs


def replay(graph: torch.cuda.CUDAGraph, outputs: Outputs) -> Outputs:
    graph.replay()
    torch.cuda.synchronize()
    return tuple(out.clone() for out in outputs)


class DenseLayers(torch.nn.Module):
    """``up`` (ColumnParallelLinear HIDDEN -> INTERMEDIATE) and ``down`` (RowParallelLinear back), bf16."""

    def __init__(self, quant_algo: str = "NVFP4") -> None:
        from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        quant_config = ModelOptNvFp4Config(quant_algo, True, None, [], 16)
        self.quant_method_name = quant_config.quant_method
        self.up = ColumnParallelLinear(HIDDEN, INTERMEDIATE, bias=False, quant_config=quant_config, prefix="up",
                                       params_dtype=torch.bfloat16)
        self.down = RowParallelLinear(INTERMEDIATE, HIDDEN, bias=False, quant_config=quant_config, prefix="down",
                                      params_dtype=torch.bfloat16)

    def load_weights(self, weights):
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)


class MoELayer(torch.nn.Module):
    """vLLM's fused-MoE layer (its factory, ModelOpt NVFP4 config), bf16, loaded by expert mapping."""

    def __init__(self, quant_algo: str = "NVFP4") -> None:
        from vllm.model_executor.layers import fused_moe
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        factory = getattr(fused_moe, "FusedMoEFactory", None) or fused_moe.FusedMoE
        self.experts = factory(
            num_experts=EXPERTS, top_k=TOP_K, hidden_size=HIDDEN, intermediate_size=MOE_INTERMEDIATE,
            params_dtype=torch.bfloat16, quant_config=ModelOptNvFp4Config(quant_algo, True, None, [], 16),
            prefix=f"gpu{next(_model_numbers)}.experts", tp_size=1, dp_size=1, pcp_size=1,
        )

    @property
    def routed(self) -> torch.nn.Module:
        return self.experts.routed_experts

    def load_weights(self, weights):
        self.num_experts = EXPERTS
        if hasattr(self.experts, "load_weights"):
            from vllm.model_executor.models.utils import AutoWeightsLoader

            return AutoWeightsLoader(self).load_weights(weights)
        return load_experts_by_mapping(self, weights)


# --- checkpoints: trained bf16 weights, exported as a QAT export writes them -----------------------


def trained_dense(seed: int) -> dict[str, torch.Tensor]:
    """bf16 weights of ``DenseLayers`` as a trainer holds them."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "up.weight": (torch.randn(INTERMEDIATE, HIDDEN, generator=generator, device="cpu") * 0.05).to(torch.bfloat16),
        "down.weight": (torch.randn(HIDDEN, INTERMEDIATE, generator=generator, device="cpu") * 0.03).to(torch.bfloat16),
    }


def trained_moe(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for expert in range(EXPERTS):
        for proj, shape in (("gate_proj", (MOE_INTERMEDIATE, HIDDEN)), ("up_proj", (MOE_INTERMEDIATE, HIDDEN)),
                            ("down_proj", (HIDDEN, MOE_INTERMEDIATE))):
            scale = 0.05 * (expert + 1) / EXPERTS
            weight = torch.randn(*shape, generator=generator, device="cpu") * scale
            weights[f"experts.{expert}.{proj}.weight"] = weight.to(torch.bfloat16)
    return weights


def export(trained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ModelOpt NVFP4 checkpoint of ``trained`` (``export_nvfp4`` per weight, on CPU)."""
    checkpoint: dict[str, torch.Tensor] = {}
    for name, weight in trained.items():
        checkpoint.update(export_nvfp4(name.removesuffix(".weight"), weight))
    return checkpoint


def on_gpu(checkpoint: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    return list(items({name: tensor.cuda() for name, tensor in checkpoint.items()}))


def fake_quantized(checkpoint: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """What the QAT forward multiplies by: the dequantised NVFP4 weight, float32 on the GPU."""
    return dequantize(checkpoint[f"{prefix}.weight"], checkpoint[f"{prefix}.weight_scale"],
                      checkpoint[f"{prefix}.weight_scale_2"]).cuda()


def loaded(model: torch.nn.Module, checkpoint: dict[str, torch.Tensor]) -> torch.nn.Module:
    model.load_weights(on_gpu(checkpoint))
    process_weights_after_loading(model)
    return model


# --- references and bounds -------------------------------------------------------------------------


def activations(rows: int, features: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, features, generator=generator, device="cpu").to(torch.bfloat16).cuda()


def linear_expected(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference output and the per-element bound (module docstring)."""
    reference = x.float() @ weight.T
    bound = 2.0**-7 * (x.float().abs() @ weight.abs().T) + 2.0**-8 * reference.abs()
    return reference, bound


def routing(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's default MoE routing: softmax, top-k, renormalised."""
    weights, ids = torch.softmax(logits.float(), dim=-1).topk(TOP_K, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def moe_expected(x: torch.Tensor, logits: torch.Tensor, checkpoint: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    topk_weights, topk_ids = routing(logits)
    reference = torch.zeros(x.shape[0], HIDDEN, device=x.device)
    magnitude = torch.zeros_like(reference)
    xf = x.float()
    for expert in range(EXPERTS):
        gate = fake_quantized(checkpoint, f"experts.{expert}.gate_proj")
        up = fake_quantized(checkpoint, f"experts.{expert}.up_proj")
        down = fake_quantized(checkpoint, f"experts.{expert}.down_proj")
        g, u = xf @ gate.T, xf @ up.T
        out = (torch.nn.functional.silu(g) * u) @ down.T
        size = ((xf.abs() @ gate.abs().T) * (xf.abs() @ up.abs().T)) @ down.abs().T
        weight = (topk_weights * (topk_ids == expert)).sum(-1, keepdim=True)
        reference += weight * out
        magnitude += weight * size
    return reference, 2.0**-6 * magnitude + 2.0**-8 * reference.abs()


def assert_within(out: torch.Tensor, expected: tuple[torch.Tensor, torch.Tensor], what: str) -> float:
    """Asserts ``|out - ref| <= bound`` everywhere; returns the largest error as a fraction of its bound."""
    reference, bound = expected
    error = (out.float() - reference).abs()
    ratio = float((error / bound).max())
    assert out.dtype == torch.bfloat16, what
    assert torch.isfinite(out).all(), what
    assert ratio <= 1.0, f"{what}: error {ratio:.3f}x the bf16 bound (max abs error {float(error.max()):.3g})"
    return ratio


# --- running vLLM's layers -------------------------------------------------------------------------


@contextlib.contextmanager
def forward_context(vllm_config: object) -> Iterator[None]:
    """vLLM's forward context for a MoE call outside a model runner, layer looked up by its name."""
    from vllm.forward_context import get_forward_context, set_forward_context
    from vllm.v1.worker.workspace import init_workspace_manager, is_workspace_manager_initialized

    if not is_workspace_manager_initialized():  # what vLLM's GPU model runner sets up (Marlin MoE uses it)
        init_workspace_manager(torch.device("cuda"))
    with set_forward_context(None, vllm_config):
        get_forward_context().all_moe_layers = None  # address our layer by name, not by call order
        yield


def moe_forward(model: MoELayer, x: torch.Tensor, logits: torch.Tensor, vllm_config: object) -> torch.Tensor:
    with forward_context(vllm_config):
        return model.experts(x, logits)


def cuda_kernels_run(fn) -> list[str]:
    """Names of the CUDA kernels ``fn()`` launched (torch's profiler, CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA})


def kernel_tensors(module: torch.nn.Module) -> dict[str, int]:
    """Data pointers of every parameter, buffer and plain tensor attribute (Marlin's workspace) below
    ``module``: what a captured CUDA graph reads."""
    pointers = {}
    for prefix, sub in module.named_modules():
        for name, tensor in itertools.chain(sub.named_parameters(recurse=False), sub.named_buffers(recurse=False),
                                            ((k, v) for k, v in vars(sub).items() if isinstance(v, torch.Tensor))):
            pointers[f"{prefix}.{name}"] = tensor.data_ptr()
    return pointers


@contextlib.contextmanager
def built_as_vllm_builds() -> Iterator[None]:
    """On the GPU with the model's dtype (bf16) as torch's default, as vLLM's loader builds a model
    (``set_default_torch_dtype(model_config.dtype)``): quantized methods read their output dtype from that
    default (``Fp8LinearMethod``), and CUTLASS's scaled GEMMs write only bf16 or fp16."""
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_default_torch_dtype(torch.bfloat16), torch.device("cuda"):
        yield


def assert_same_tensors(model: torch.nn.Module, reference: torch.nn.Module, step: int,
                        placeholders: frozenset[str] = frozenset()) -> None:
    """Every parameter and buffer of ``model`` equals ``reference``'s bit for bit (shape and dtype too),
    but for ``placeholders``: names (last part) of parameters the layer registers and never reads, which
    vLLM's first load leaves as ``torch.empty`` made them."""
    from nvfp4_helpers import bits

    ours = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    theirs = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        if name.rpartition(".")[2] in placeholders:
            continue
        assert (ours[name].shape, ours[name].dtype) == (tensor.shape, tensor.dtype), name
        assert torch.equal(bits(ours[name]), bits(tensor)), f"refit {step}: {name} differs from vLLM's first load"


def refits_under_a_captured_graph(
    build: Callable[[], torch.nn.Module],
    states: list[dict[str, torch.Tensor]],
    forward: Callable[[torch.nn.Module], Outputs],
    vllm_config: object,
    *,
    refits: int = 6,
    placeholders: frozenset[str] = frozenset(),
) -> torch.nn.Module:
    """As verl runs a refit: a dummy start, a CUDA graph of ``forward`` captured, then ``refits`` refits of
    ``states`` in turn. After each: every kernel tensor at its address and equal bit for bit to vLLM's own
    first load of that checkpoint into a fresh model (``build``, its loaders, its processing); the graph's
    replay equal bit for bit to an eager forward and to the fresh model's. Then a wrong shape in the last
    weight raises ``RefitError`` and the graph serves the old weights bit for bit. Returns the refitted model."""
    from nvfp4_helpers import dummy_started
    from patchkit.patches.vllm.refit import RefitError, refit_weights

    def first_load(checkpoint: dict[str, torch.Tensor]) -> torch.nn.Module:
        with built_as_vllm_builds():
            fresh = build()
        fresh.load_weights(on_gpu(checkpoint))
        process_weights_after_loading(fresh)
        return fresh

    with built_as_vllm_builds():
        model = dummy_started(build(), vllm_config)
    pointers = kernel_tensors(model)
    graph, outputs = capture(lambda: forward(model))
    for step in range(refits):
        checkpoint = states[step % len(states)]
        refit_weights(model, on_gpu(checkpoint))
        assert kernel_tensors(model) == pointers, f"refit {step} moved kernel tensors"
        fresh = first_load(checkpoint)
        assert_same_tensors(model, fresh, step, placeholders)
        served = replay(graph, outputs)
        for got, eager, theirs in zip(served, forward(model), forward(fresh), strict=True):
            assert torch.isfinite(got.float()).all() and got.abs().sum() > 0, f"refit {step}"
            assert torch.equal(got, eager), f"refit {step}: the graph does not serve what eager forward does"
            assert torch.equal(got, theirs), f"refit {step}: the refit serves other outputs than vLLM's first load"
    other = states[refits % len(states)]  # not the last one refitted: the check can tell states apart
    assert not torch.equal(replay(graph, outputs)[0], forward(first_load(other))[0])
    before = replay(graph, outputs)
    broken = dict(states[0])
    last = next(n for n in reversed(broken) if n.endswith(("weight", "weight_packed")))
    broken[last] = broken[last][:, : broken[last].shape[1] // 2].contiguous()
    with pytest.raises(RefitError):
        refit_weights(model, on_gpu(broken))
    assert kernel_tensors(model) == pointers
    for got, want in zip(replay(graph, outputs), before, strict=True):
        assert torch.equal(got, want), "a failed refit changed what the graph serves"
    return model


def linears_forward(up_features: int, down_features: int) -> Callable[[torch.nn.Module], Outputs]:
    """A captured graph's forward of a model with ``gate_up`` and ``down`` linears: fixed bf16 activations
    of ``up_features`` and ``down_features`` through each."""
    x_up, x_down = activations(16, up_features, seed=4), activations(16, down_features, seed=5)

    def forward(model: torch.nn.Module) -> Outputs:
        return model.gate_up(x_up)[0], model.down(x_down)[0]

    return forward


def experts_forward(hidden: int, experts: int, vllm_config: object) -> Callable[[torch.nn.Module], Outputs]:
    """A captured graph's forward of a model whose ``experts`` is a fused-MoE layer: fixed bf16 activations
    and router logits."""
    x, logits = activations(16, hidden, seed=6), activations(16, experts, seed=7)

    def forward(model: torch.nn.Module) -> Outputs:
        with forward_context(vllm_config):
            return (model.experts(x, logits),)

    return forward


def forward_of(kind: str, vllm_config: object, *, hidden: int, down_features: int, experts: int
               ) -> Callable[[torch.nn.Module], Outputs]:
    """The forward a refit test's graph captures: :func:`linears_forward` for ``kind == "linear"`` (``gate_up``
    takes ``hidden`` features, ``down`` takes ``down_features``), else :func:`experts_forward`."""
    if kind == "linear":
        return linears_forward(hidden, down_features)
    return experts_forward(hidden, experts, vllm_config)


def _named(value: object) -> str:
    """A string as it is, an enum member by its name (``Fp8MoeBackend.TRITON``), anything else by its class."""
    if isinstance(value, str):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return type(value).__name__


def quant_method_in_use(model: torch.nn.Module) -> str:
    """The quantized method (and its scheme, kernel or backend) of ``model``'s ``gate_up`` or MoE layer, for
    the log: what vLLM picked on this GPU."""
    layer = model.gate_up if hasattr(model, "gate_up") else model.routed
    method = layer.quant_method
    owners = [method, getattr(layer, "scheme", None)]
    parts = [type(owner).__name__ for owner in owners if owner is not None]
    for owner in owners:
        for attribute in ("fp8_linear", "kernel", "fp8_backend", "nvfp4_backend", "mxfp4_backend", "backend"):
            value = getattr(owner, attribute, None)
            if value is not None:
                parts.append(f"{attribute}={_named(value)}")
    return " ".join(parts)


def format_refits_under_a_captured_graph(
    patch_id: str,
    kind: str,
    build: Callable[[], torch.nn.Module],
    states: list[dict[str, torch.Tensor]],
    vllm_config: object,
    *,
    hidden: int,
    down_features: int,
    experts: int,
    label: str,
    placeholders: frozenset[str] = frozenset(),
) -> None:
    """A refit format's GPU test: with ``patch_id`` installed, :func:`refits_under_a_captured_graph` of the
    ``kind`` model ``build`` makes, on the forward :func:`forward_of` gives; logs, under ``label``, what
    vLLM served it with."""
    with installed(patch_id):
        forward = forward_of(kind, vllm_config, hidden=hidden, down_features=down_features, experts=experts)
        model = refits_under_a_captured_graph(build, states, forward, vllm_config, placeholders=placeholders)
        logger.info("%s: %s", label, quant_method_in_use(model))
