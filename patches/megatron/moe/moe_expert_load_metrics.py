"""Log how evenly each MoE router spreads its tokens over the experts (megatron-core 0.14-0.19).

Declaration module. Next to the load-balancing loss a router logs in ``_apply_aux_loss``, the MoE
tracker gets two per-layer metrics from the same routing map, counted over the router's
tensor- and context-parallel group as the loss counts it: ``expert_distributed_std`` (the standard
deviation of the tokens per expert) and ``max_token_per_expert`` (the busiest expert's tokens).
Upstream logs the loss alone, which says that the load is uneven but not how uneven.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, ROUTER

PATCHES = (
    Patch(
        id="megatron.moe_expert_load_metrics",
        self_check="._checks.moe_expert_load_metrics:check_moe_expert_load_metrics",
        summary=(
            "MoE routers also log expert_distributed_std and max_token_per_expert (tokens per expert over "
            "the router's TP x CP group) in the MoE tracker, in the slot of their load-balancing loss, "
            "whenever they log that loss (aux_loss balancing with a non-zero coefficient)."
        ),
        why=(
            "The load-balancing loss alone does not show how many tokens the busiest expert gets, which "
            "decides capacity drops and all-to-all imbalance; ROLL logs both metrics by replacing "
            "TopKRouter._apply_aux_loss (mcore_adapter patch_apply_aux_loss), a copy that does not "
            "import on megatron-core 0.14-0.15."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_r0.19.0/megatron/core/transformer/moe/router.py",
        removal="Remove if upstream logs per-expert load statistics itself (not in 0.19.2 nor main d98e8a6).",
        # Opt-in: one more all-reduce (of num_experts counts) per MoE layer and two more tracker entries.
        opt_in=True,
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="log-after-aux-loss",
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(f"{ROUTER}:TopKRouter._apply_aux_loss", "._moe_expert_load_metrics:wrap_apply_aux_loss"),
                ),
            ),
        ),
    ),
)
