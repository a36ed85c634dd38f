"""Batched pipeline send/receive on the default process group, as the shape exchange (megatron-core 0.14-0.19).

Declaration module. ``P2PCommunicator._communicate`` (``pipeline_parallel/p2p_communication.py``)
exchanges activations and gradients between pipeline stages through ``_batched_p2p_ops`` (with
``batch_p2p_comm``, the default), which gives each ``torch.distributed.P2POp`` the pipeline group;
with ``variable_seq_lengths`` its ``_communicate_shapes`` first exchanges the shapes through ops given
no group, that is on the default group. One step's pipeline p2p then alternates between two
communicators, and NCCL's batched p2p is fragile there: the first ``batch_isend_irecv`` on a group
needs every rank of that group (torch's documented rule), which a pipeline of more than two stages
does not give, and p2p alternating between the default group and a subgroup has been seen to hang.
slime drops ``group`` from the four ops (``docker/patch/latest/megatron.patch``, without a stated
reason).

With the patch, ``_batched_p2p_ops`` builds its ops without a group: every batched pipeline p2p goes
through the default group, whose communicator every rank has used; the peers are global ranks
already, so the same tensors reach the same stages. Opt-in: the pipeline traffic leaves the pipeline
group's communicator.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_P2P = "megatron.core.pipeline_parallel.p2p_communication"

PATCHES = (
    Patch(
        id="megatron.pipeline_p2p_default_group",
        self_check="._checks.pipeline_p2p_default_group:check_pipeline_p2p_default_group",
        summary=(
            "Batched pipeline-parallel send/receive (_batched_p2p_ops) goes through the default process "
            "group, as upstream's shape exchange does, instead of the pipeline group."
        ),
        why=(
            "With variable_seq_lengths upstream exchanges shapes on the default group and tensors on the "
            "pipeline group; NCCL batched p2p across two communicators, or first used on a group by some "
            "of its ranks only, can hang. slime drops the group from the four P2POps."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"
            "megatron/core/pipeline_parallel/p2p_communication.py"
        ),
        removal="Remove once upstream sends its shapes and tensors on one group (not in 0.19).",
        opt_in=True,
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(Wrap(f"{_P2P}:_batched_p2p_ops", "._pipeline_p2p_default_group:wrap_batched_p2p_ops"),),
            ),
        ),
    ),
)
