"""MoE routers inside multi-token-prediction layers: their own layer slots, after the decoder's."""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, MTP, ROUTER

_MOE_UTILS = "megatron.core.transformer.moe.moe_utils"
_TRACK_MOE_METRICS = Wrap(f"{_MOE_UTILS}:track_moe_metrics", "._mtp_router_slots.v014:wrap_track_moe_metrics")

PATCHES = (
    Patch(
        id="megatron.mtp_router_slots",
        self_check="._checks.mtp_router_slots:check_mtp_router_slots",
        summary=(
            "MoE routers of MTP layers get layer slots after the decoder's (num_layers + depth): their "
            "aux/z-loss in the MoE tracker (0.14-0.15), the forced tracker entries sized decoder + MTP "
            "(0.14-0.16), and their replay state's layer_number (0.19)."
        ),
        why=(
            "An MTP layer numbers its inner transformer layer from 1 again (0.14-0.15, 0.17+), so its "
            "router aliases a backbone layer: 0.14-0.15 add the MTP router's load-balancing and z-loss "
            "into decoder layer 1's slot of the MoE tracker (upstream's own TODO says so) and leave the "
            "MTP slots empty; 0.19 stamps the MTP router's RouterReplay with the aliased layer_number, "
            "so a framework that keys replay data by it feeds backbone routes into MTP routers "
            "(NeMo-RL #3903). 0.14-0.16's track_moe_metrics(force_initialize=True) sizes a fresh "
            "entry for the decoder only while routers size it decoder + MTP: pipeline ranks then "
            "all-reduce tensors of different sizes (0.17 fixed that)."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.17.1/megatron/core/transformer/moe/router.py "
            "(is_mtp_layer: layer_number + num_layers) and core_v0.17.1 moe_utils.track_moe_metrics"
        ),
        removal=(
            "Remove the 0.14-0.16 variants with support for those releases; the 0.19 variant once "
            "upstream numbers an MTP router's replay state apart from the decoder's (not in 0.19.2 "
            "nor main d98e8a6; Megatron-LM #7404 is open)."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="number-after-decoder",
                requires={"megatron-core": ">=0.14,<0.16"},
                installs=(
                    Wrap(f"{MTP}:MultiTokenPredictionLayer.__init__", "._mtp_router_slots.v014:wrap_mtp_layer_init"),
                    _TRACK_MOE_METRICS,
                ),
            ),
            Variant(
                label="size-forced-tracker",
                requires={"megatron-core": ">=0.16,<0.17"},
                installs=(_TRACK_MOE_METRICS,),
            ),
            Variant(
                label="native-0.17",
                requires={"megatron-core": ">=0.17,<0.19"},
                native=(
                    "routers built with is_mtp_layer log at layer_number + num_layers, and "
                    "track_moe_metrics sizes forced entries num_layers + mtp_num_layers (0.17+); "
                    "RouterReplay has no layer_number before 0.19"
                ),
            ),
            Variant(
                label="replay-layer-number",
                requires={"megatron-core": ">=0.19,<0.20"},
                installs=(Wrap(f"{ROUTER}:Router.set_layer_number", "._mtp_router_slots.v019:wrap_set_layer_number"),),
            ),
        ),
    ),
)
