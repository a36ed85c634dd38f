"""Self-check of ``vllm.radio_layerscale_loader``: vLLM's own ``RadioModel`` (tiny), its parameters randomised
as a dummy load leaves them, loaded once from a checkpoint with LayerScale entries and once from one
without; its ``ls1``/``ls2`` then hold the checkpoint's values, or the config's ``initializer_factor``."""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, expect

from ._tiny_radio import INITIALIZER_FACTOR, checkpoint, checkpoint_value, layerscale_names, randomise, tiny_radio_model


def check_radio_layerscale_loader(context: CheckContext) -> None:
    """LayerScale loaded from the checkpoint where it has it, ``initializer_factor`` where it has none."""
    from ._cpu_stand_in import vllm_context

    with vllm_context(context.device):
        _check_loads(context.device)


def _check_loads(device: str) -> None:
    model = tiny_radio_model(device)
    randomise(model, seed=0)
    explicit = checkpoint(model, layerscale="plain")
    loaded = model.load_weights(explicit)
    params = dict(model.named_parameters())
    wrong = [name for name in layerscale_names()
             if not torch.equal(params[name].detach(), checkpoint_value(explicit, name))]
    expect(not wrong, "RADIO LayerScale parameters loaded from a checkpoint that has them", "all equal to the "
           "checkpoint's", f"differing: {wrong}")
    expect(set(layerscale_names()) <= loaded, "RADIO LayerScale names among those load_weights returns",
           "all of them", sorted(set(layerscale_names()) - loaded))

    folded_model = tiny_radio_model(device)
    randomise(folded_model, seed=0)
    folded_model.load_weights(checkpoint(folded_model, layerscale=None))
    params = dict(folded_model.named_parameters())
    wrong = [name for name in layerscale_names()
             if not bool((params[name].detach() == INITIALIZER_FACTOR).all())]
    expect(not wrong, "RADIO LayerScale parameters after a checkpoint without them (folded), over dummy "
           "weights", f"initializer_factor {INITIALIZER_FACTOR}", f"differing: {wrong}")
