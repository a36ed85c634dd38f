"""``megatron.dsa_hadamard_fallback``: Megatron's DSA indexer rotates without ``fast_hadamard_transform``.

Against megatron-core's own ``dsa.rotate_activation`` (0.16-0.19), on CPU, where the CUDA-only
package is not installed: upstream fails its assert, the patched module returns ``H x / sqrt(d)``.
The truth for the transform is ``x @ scipy.linalg.hadamard(n) * scale``, as the package documents
it (``fast_hadamard_transform_interface.py``), zero-padded to a power of two as its reference does;
where scipy is not installed, the same matrix built by the Sylvester construction. verl's
``apply_fast_hadamard_transform_shim`` (``verl/models/mcore/patch.py``) is the framework fix this
replaces.
"""

from __future__ import annotations

import importlib.util
import json
from importlib.metadata import version

import pytest
import torch
from doctor_verdicts import verdict_of
from fresh_process import last_printed
from packaging.version import Version
from patchkit.patches.megatron._errors import HadamardInputError
from patchkit.patches.megatron.dsa._checks._rotation import (
    expected_rotation,
    expected_transform,
    rounding_excess,
    sylvester_hadamard,
    upstream_rotation,
)
from patchkit.patches.megatron.dsa._dsa_hadamard_fallback import hadamard_transform

import patchkit
from patchkit.doctor import FAILED, VERIFIED

PATCH = "megatron.dsa_hadamard_fallback"
DSA = "megatron.core.transformer.experimental_attention_variant.dsa"
MCORE = Version(version("megatron-core"))
HAS_DSA = MCORE >= Version("0.16")
PACKAGE_INSTALLED = importlib.util.find_spec("fast_hadamard_transform") is not None

needs_dsa = pytest.mark.skipif(not HAS_DSA, reason="megatron-core has DSA (dsa.py) from 0.16")
needs_package_absent = pytest.mark.skipif(PACKAGE_INSTALLED, reason="fast_hadamard_transform is installed here")

pytestmark = pytest.mark.usefixtures("patches_restored")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Powers of two up to 4096, then widths the transform pads (the kernel's own test uses 137).
WIDTHS = (1, 2, 8, 64, 128, 512, 4096, 3, 96, 137, 1000)
BATCHES = ((), (7,), (2, 3, 4))


def hadamard_matrix(order: int) -> torch.Tensor:
    """``scipy.linalg.hadamard(order)`` as float64, or the Sylvester construction where scipy is absent."""
    try:
        from scipy.linalg import hadamard
    except ImportError:
        return sylvester_hadamard(order)
    return torch.tensor(hadamard(order).tolist(), dtype=torch.float64)


def padded_order(width: int) -> int:
    return 1 << (width - 1).bit_length()


def test_sylvester_construction_is_scipys_hadamard_matrix():
    scipy_linalg = pytest.importorskip("scipy.linalg")
    for order in (1, 2, 4, 8, 64, 1024):
        assert torch.equal(sylvester_hadamard(order), torch.tensor(scipy_linalg.hadamard(order).tolist(),
                                                                   dtype=torch.float64))


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: "x".join(map(str, b)) or "row")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
def test_transform_is_x_times_the_hadamard_matrix_times_scale(width, dtype, batch):
    generator = torch.Generator().manual_seed(width)
    x = torch.randn((*batch, width), generator=generator).to(dtype)
    scale = width**-0.5
    found = hadamard_transform(x, scale=scale)
    expected = expected_transform(x, scale, hadamard_matrix(padded_order(width)))
    assert found.shape == x.shape and found.dtype == dtype
    assert rounding_excess(found, expected, x, scale) <= 1.0


@pytest.mark.parametrize("width", (16, 256, 24))
def test_transform_of_small_integers_is_exact_and_scale_defaults_to_one(width):
    """Integers stay exact in float32, so the result is the matrix product itself, row order included."""
    x = torch.randint(-3, 4, (5, width), generator=torch.Generator().manual_seed(1)).to(torch.float32)
    matrix = hadamard_matrix(padded_order(width))
    expected = (torch.nn.functional.pad(x.double(), (0, matrix.shape[0] - width)) @ matrix)[:, :width]
    assert torch.equal(hadamard_transform(x), expected.float())


def test_transform_of_a_non_contiguous_view_equals_that_of_its_copy():
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).t()
    assert not x.is_contiguous()
    assert torch.equal(hadamard_transform(x, scale=0.125), hadamard_transform(x.contiguous(), scale=0.125))


@pytest.mark.parametrize("width", (128, 137))
def test_gradient_is_the_transform_of_the_output_gradient(width):
    """The kernel's backward: ``H`` is symmetric, so the gradient is the same transform of ``dout``."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, width, generator=generator, requires_grad=True)
    dout = torch.randn(4, width, generator=generator)
    scale = width**-0.5
    hadamard_transform(x, scale=scale).backward(dout)
    assert x.grad is not None
    assert rounding_excess(x.grad, expected_transform(dout, scale), dout, scale) <= 1.0


@pytest.mark.parametrize(
    "x, reason",
    [
        (torch.ones(4, 8, dtype=torch.float64), "the dtype is not float32, float16 or bfloat16"),
        (torch.ones(4, 8, dtype=torch.int32), "the dtype is not float32, float16 or bfloat16"),
        (torch.ones(1, 32769), "the last dimension is 32769"),
        (torch.ones(4, 0), "the last dimension is 0"),
        (torch.tensor(1.0), "the last dimension is 0"),
    ],
    ids=["float64", "int32", "wider-than-the-kernel", "empty-rows", "scalar"],
)
def test_transform_refuses_what_the_kernel_refuses(x, reason):
    with pytest.raises(HadamardInputError, match=reason) as raised:
        hadamard_transform(x)
    assert isinstance(raised.value, ValueError) and raised.value.shape == tuple(x.shape)


def test_transform_takes_the_kernels_widest_rows():
    x = torch.zeros(1, 32768)
    x[0, 1] = 1.0  # H e_1 is column 1 of H: alternating signs
    expected = torch.tensor([1.0, -1.0]).repeat(16384)
    assert torch.equal(hadamard_transform(x)[0], expected)


@needs_dsa
@needs_package_absent
def test_upstream_rotate_activation_asserts_without_fast_hadamard_transform():
    rotation = upstream_rotation(torch.randn(3, 2, 128).to(torch.bfloat16))
    assert rotation.error == "AssertionError: fast_hadamard_transform is not installed."


@needs_dsa
@pytest.mark.parametrize("shape", [(5, 2, 4, 128), (5, 2, 128), (3, 1, 64), (3, 1, 96)],
                         ids=["queries", "keys", "head-dim-64", "head-dim-96"])
def test_patched_rotate_activation_is_the_normalised_hadamard_rotation(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with patchkit.applied(PATCH) as (status,):
        assert status.to_dict()["state"] == "applied"
        rotation = upstream_rotation(x)
    assert rotation.error is None and rotation.result is not None
    scale = shape[-1] ** -0.5
    assert rounding_excess(rotation.result, expected_rotation(x), x, scale) <= 1.0
    scipy_truth = expected_transform(x, scale, hadamard_matrix(padded_order(shape[-1])))
    assert rounding_excess(rotation.result, scipy_truth, x, scale) <= 1.0


@needs_dsa
def test_patch_keeps_the_function_of_an_importable_fast_hadamard_transform(monkeypatch):
    """Where the package imported, ``dsa`` holds its function: the patch leaves that very object there."""
    dsa = importlib.import_module(DSA)
    calls = []

    def installed_hadamard_transform(x, scale=1.0):  # the package's function, as dsa.py bound it
        calls.append(scale)
        return x * scale

    monkeypatch.setattr(dsa, "hadamard_transform", installed_hadamard_transform)
    with patchkit.applied(PATCH) as (status,):
        assert status.to_dict()["state"] == "applied"
        assert dsa.hadamard_transform is installed_hadamard_transform
        dsa.rotate_activation(torch.ones(2, 64, dtype=torch.bfloat16))
    assert dsa.hadamard_transform is installed_hadamard_transform
    assert calls == [64**-0.5]


@needs_dsa
@needs_package_absent
def test_revert_puts_the_missing_binding_back():
    dsa = importlib.import_module(DSA)
    with patchkit.applied(PATCH):
        assert dsa.hadamard_transform is hadamard_transform
    assert dsa.hadamard_transform is None
    assert upstream_rotation(torch.randn(2, 128).to(torch.bfloat16)).error is not None


@needs_dsa
@needs_package_absent
def test_apply_all_at_start_up_fills_the_binding_when_dsa_is_imported_later():
    """The order of a real process: patchkit applies its defaults first, Megatron's DSA is imported after."""
    script = (
        "import json, sys, torch, patchkit\n"
        "patchkit.apply_all()\n"
        f"assert {DSA!r} not in sys.modules\n"
        f"from {DSA} import rotate_activation\n"
        "x = torch.ones(1, 8, dtype=torch.bfloat16)\n"
        "(record,) = [r.to_dict() for r in patchkit.status() if r.to_dict()['id'] == " + repr(PATCH) + "]\n"
        "print(json.dumps({'state': record['state'], 'row': rotate_activation(x)[0].float().tolist()}))\n"
    )
    found = last_printed(script, without=("PATCHKIT_",), timeout=240, check=True)
    first = torch.tensor(8 * 8**-0.5, dtype=torch.bfloat16).item()  # H times ones: 8 in column 0, 0 elsewhere
    assert found == {"state": "applied", "row": [first] + [0.0] * 7}, json.dumps(found)


class DuplicatedLinear(torch.nn.Linear):
    """What the DSA spec builds the indexer's projections with, TransformerEngine's
    ``TELinear(parallel_mode="duplicated")``, on one rank without TE: a linear returning ``(out, None)``."""

    def __init__(self, in_features, out_features, *, config, init_method, bias, skip_bias_add,
                 skip_weight_param_allocation, parallel_mode):
        assert parallel_mode == "duplicated" and not skip_weight_param_allocation
        super().__init__(in_features, out_features, bias=bias, dtype=config.params_dtype)

    def forward(self, x):
        return super().forward(x), None


def tiny_dsa_indexer():
    """Upstream's ``DSAIndexer`` (2 heads of 64, top-4) on a tiny MLA config, bf16 on CPU."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexer, DSAIndexerSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_head_dim=16,
        qk_pos_emb_head_dim=16, v_head_dim=16, rope_type="rope", dsa_indexer_n_heads=2, dsa_indexer_head_dim=64,
        dsa_indexer_topk=4, params_dtype=torch.bfloat16, bf16=True, use_cpu_initialization=True)
    submodules = DSAIndexerSubmodules(linear_wq_b=DuplicatedLinear, linear_wk=DuplicatedLinear,
                                      k_norm=LocalSpecProvider().layer_norm(rms_norm=False, for_qk=True),
                                      linear_weights_proj=DuplicatedLinear)
    torch.manual_seed(5)
    return build_module(ModuleSpec(module=DSAIndexer, submodules=submodules), config=config)


@needs_dsa
@needs_package_absent
def test_dsa_indexer_forward_fails_upstream_and_scores_as_with_the_exact_rotation_patched(megatron_cpu, monkeypatch):
    """The indexer's whole forward: upstream stops at the assert; patched, its index scores equal those
    the indexer computes when the module's binding is the float64 matrix product itself. (Scores are
    dot products, which any orthogonal rotation keeps: the matrix itself is pinned by the
    ``rotate_activation`` tests above; this one proves the path runs and the normalisation.)"""
    dsa = importlib.import_module(DSA)
    indexer = tiny_dsa_indexer()
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(6, 2, 64, generator=generator).to(torch.bfloat16)
    qr = torch.randn(6, 2, 32, generator=generator).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="fast_hadamard_transform is not installed"):
        indexer(x, qr)
    with patchkit.applied(PATCH):
        scores, topk = indexer.forward_with_scores(x, qr)
    monkeypatch.setattr(dsa, "hadamard_transform", expected_transform)
    exact_scores, _ = indexer.forward_with_scores(x, qr)
    assert topk.shape == (2, 6, 4)
    torch.testing.assert_close(scores, exact_scores)  # bf16's tolerance: the rotations differ by rounding at most


@pytest.mark.skipif(HAS_DSA, reason="megatron-core 0.16+ has DSA")
def test_patch_is_not_applicable_before_megatron_core_has_dsa():
    with patchkit.applied(PATCH) as (status,):
        record = status.to_dict()
    assert (record["state"], record["reason"]) == ("skipped", "unsupported_version")
    assert importlib.util.find_spec("megatron.core.transformer.experimental_attention_variant") is None


@needs_dsa
def test_check_is_verified():
    verdict = verdict_of(PATCH, applied=True)
    assert verdict.verdict == VERIFIED, verdict.message


@needs_dsa
@needs_package_absent
@pytest.mark.breaks("megatron.dsa_hadamard_fallback")
def test_check_fails_with_upstreams_missing_binding():
    verdict = verdict_of(PATCH, applied=True, as_upstream=True)
    assert verdict.verdict == FAILED
    assert "rotate_activation on a bf16" in verdict.message
    assert "fast_hadamard_transform is not installed" in verdict.message
