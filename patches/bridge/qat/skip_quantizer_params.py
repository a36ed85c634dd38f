"""``bridge.skip_quantizer_params``: ModelOpt quantizer state (*_quantizer.*) is left out of Megatron-to-HF
weight export.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import BLOB, BRIDGE, MODEL_BRIDGE, V02_V03, V04_V06

PATCHES = (
    Patch(
        id="bridge.skip_quantizer_params",
        self_check="._checks.skip_quantizer_params:check_skip_quantizer_params",
        summary="ModelOpt quantizer state (*_quantizer.*) is left out of Megatron-to-HF weight export.",
        why=(
            "Quantizer amax buffers are persistent buffers: Bridge tries to export them, warns for each, "
            "and under expert parallelism fails parsing '.weight_quantizer' as an expert number."
        ),
        upstream=f"{BLOB}/conversion/model_bridge.py",
        removal="Remove when Bridge's export filters quantizer state itself.",
        version_modules=BRIDGE,
        variants=(
            Variant(
                requires=V02_V03,
                installs=(
                    Wrap(f"{MODEL_BRIDGE}:persistent_buffers", "._skip_quantizer_params:wrap_persistent_buffers"),
                ),
            ),
            Variant(
                # 0.4 added Bridge's own quantized export: with ENABLE_BRIDGE_QUANT_MAPPING=1 the mapping
                # registry maps *.weight_quantizer._amax / *.input_quantizer._amax, and the wrap steps aside.
                requires=V04_V06,
                installs=(
                    Wrap(f"{MODEL_BRIDGE}:persistent_buffers", "._skip_quantizer_params:wrap_persistent_buffers_v04"),
                ),
            ),
        ),
    ),
)
