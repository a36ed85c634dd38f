"""A new refit format costs a declaration and one row of the format table, nothing else.

The sixth format here is a quant method of this test module's own (``SixthFormatLinearMethod``: vLLM's
FP8 linear method under another class, so vLLM's loaders and processing run unchanged). Its
declaration wraps the method with the recording pair every refit patch installs (``refit._record``);
its row in ``_refit_formats.FORMATS`` names the class and the patch. With those two, vLLM's own layers
of the format are recorded at their first processing and refitted to what vLLM's own first load of the
same checkpoint serves, in the same kernel tensors; without the row, they are not recorded and a
refit refuses them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fp8_helpers import HIDDEN, INTERMEDIATE, linear_checkpoint
from nvfp4_helpers import bits, dummy_started, kernel_state, process_weights_after_loading
from patchkit.patches.vllm._checks._gate_up_down import GateUpDown
from patchkit.patches.vllm.refit import UnsupportedQuantizationError, refit_weights
from patchkit.patches.vllm.refit import _formats as _refit_formats
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod
from vllm_fixtures import installed

import patchkit
from patchkit import Patch, Variant, Wrap

PATCH_ID = "vllm.sixth_format_refit"
_RECORD = "patchkit.patches.vllm.refit._record"


class SixthFormatLinearMethod(Fp8LinearMethod):
    """The new format's quant method."""


class SixthFormatConfig(Fp8Config):
    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        return SixthFormatLinearMethod(self) if isinstance(layer, LinearBase) else None


# --- what adding the format costs: its declaration ... -------------------------------------------
DECLARATION = Patch(
    id=PATCH_ID,
    summary="sixth-format linear layers record their checkpoint parameters for refit",
    why="processing converts the checkpoint tensors",
    upstream="tests/vllm/test_refit_new_format.py",
    removal="never: a test fixture",
    version_modules={"vllm": "vllm"},
    variants=(Variant(requires={"vllm": ">=0.24,<0.34"}, label="sixth-format", installs=(
        Wrap(f"{__name__}:SixthFormatLinearMethod.create_weights", f"{_RECORD}:wrap_create_weights"),
        Wrap(f"{__name__}:SixthFormatLinearMethod.process_weights_after_loading",
             f"{_RECORD}:wrap_process_weights_after_loading"),
    )),),
)
# ... and one row of the format table.
ROW = _refit_formats.RefitFormat(PATCH_ID, "sixth-format linear layers (vllm.sixth_format_refit)",
                                 methods=(f"{__name__}:SixthFormatLinearMethod",))


def model() -> torch.nn.Module:
    return GateUpDown(SixthFormatConfig(is_checkpoint_fp8_serialized=True, activation_scheme="static"),
                      hidden=HIDDEN, intermediate=INTERMEDIATE, down=(HIDDEN, INTERMEDIATE))


@pytest.fixture
def declared(cpu_fp8_ops: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # vLLM's linear layers pick their weight loaders by the method's class name; the new format's
    # method loads as FP8's does.
    from vllm.model_executor.layers import linear

    monkeypatch.setattr(linear, "WEIGHT_LOADER_V2_SUPPORTED",
                        [*linear.WEIGHT_LOADER_V2_SUPPORTED, "SixthFormatLinearMethod"])
    engine = patchkit.engine()
    if PATCH_ID not in engine.ids():
        engine.register(DECLARATION)
    with installed(PATCH_ID):
        yield


def test_a_sixth_format_refits_with_a_declaration_and_a_table_row(
    declared: None, vllm_config: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_refit_formats, "FORMATS", (*_refit_formats.FORMATS, ROW))
    served = dummy_started(model(), vllm_config)
    pointers = {name: ptr for name, (ptr, _) in kernel_state(served).items()}
    checkpoint = linear_checkpoint(False, seed=1)
    refit_weights(served, list(checkpoint.items()))
    reference = model()
    reference.load_weights(iter(list(checkpoint.items())))
    process_weights_after_loading(reference)
    ours, theirs = kernel_state(served), kernel_state(reference)
    assert ours.keys() == theirs.keys()
    for name, (_, tensor) in theirs.items():
        assert torch.equal(bits(ours[name][1]), bits(tensor)), name
    assert {name: ptr for name, (ptr, _) in ours.items()} == pointers


def test_without_its_table_row_the_format_is_refused(declared: None, vllm_config: object) -> None:
    served = dummy_started(model(), vllm_config)
    refusal = pytest.raises(UnsupportedQuantizationError, match="SixthFormatLinearMethod")
    with patchkit.applied("vllm.fp8_refit"), refusal:  # a refit is available, not for this format
        refit_weights(served, list(linear_checkpoint(False, seed=1).items()))
