"""vLLM's RADIO vision encoder loads its LayerScale (``ls1``/``ls2``), or sets it to ``initializer_factor``.

Declaration only (see docs/writing-patches.md). vLLM's RADIO encoder (``model_executor/models/radio.py``,
used by Nemotron Nano VL and Nemotron Parse) builds InternViT layers (``RadioVisionEncoderLayer``) whose
residual branches are scaled by the parameters ``model.encoder.layers.<i>.ls1`` and ``ls2``, yet
``RadioModel.load_weights`` skips every ``radio_model.model.blocks.<i>.ls1``/``ls2`` entry of the
checkpoint. A checkpoint's LayerScale values are so ignored, and where the parameters were not left at
their constructor value (``initializer_factor``) they keep whatever they held: after a dummy load
(``load_format="dummy"``, how an RL rollout engine starts before its first weight sync) that is random
noise, and every later weight sync leaves it there. NeMo-RL rewrites the loader in vLLM's source on disk
(``nemo_rl/models/generation/vllm/patches.py``, ``_patch_vllm_radio_layerscale_loader``). The patch wraps
``RadioModel.load_weights``: the LayerScale entries (``ls1`` or timm's ``ls1.gamma``) are loaded through
the parameters' weight loaders, every LayerScale parameter no checkpoint entry has written on the model
is set to the config's ``initializer_factor`` (a checkpoint with LayerScale folded into the weights
carries none), and those names are returned among the loaded ones.

Ranges, from the wheels: ``RadioModel.load_weights`` is the same code, with the same skip, in 0.24.0,
0.25.1, 0.27.0, 0.29.0, 0.31.0 and 0.33.0. Tests ran on 0.25.1 (NeMo-RL's pin), 0.29.0 and 0.33.0.

Outside the claim: vLLM releases before 0.24 and nightlies; a weight sync that sends a LayerScale
entry under another name is not recognised (upstream's mapping of every other entry is kept).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

PATCHES = (
    Patch(
        id="vllm.radio_layerscale_loader",
        self_check="._checks.radio_layerscale_loader:check_radio_layerscale_loader",
        summary=(
            "vLLM's RadioModel.load_weights loads the checkpoint's LayerScale (ls1/ls2) and sets absent ones "
            "to the config's initializer_factor."
        ),
        why=(
            "vLLM's RADIO loader skips the checkpoint's model.blocks.<i>.ls1/ls2 although its encoder layers "
            "scale by them: explicit values are ignored, and after a dummy load the parameters stay random "
            "(NeMo-RL rewrites the loader in radio.py)."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/model_executor/models/radio.py",
        removal="Remove once vLLM's RadioModel.load_weights loads ls1/ls2 (still skipped in 0.33.0).",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                installs=(
                    Wrap(
                        "vllm.model_executor.models.radio:RadioModel.load_weights",
                        "._radio_layerscale_loader:wrap_load_weights",
                    ),
                ),
                label="load-or-fill-layerscale",
            ),
        ),
    ),
)
