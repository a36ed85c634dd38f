"""Every batched pipeline send/receive on the default process group (megatron-core 0.14-0.19).

Declaration module. ``P2PCommunicator._communicate`` (``pipeline_parallel/p2p_communication.py``)
exchanges activations and gradients between pipeline stages through ``_batched_p2p_ops`` (with
``batch_p2p_comm``, the default), which gives each ``torch.distributed.P2POp`` the pipeline group. With
``variable_seq_lengths`` (RL frameworks' dynamic batches) ``_communicate_shapes`` first exchanges the
shapes: on 0.14-0.15 through ops given no group, that is on the default group, so one step's pipeline
p2p alternates between two communicators; 0.16 gives the shape ops the pipeline group too. slime drops
``group`` from the four tensor ops (``docker/patch/latest/megatron.patch``, without a stated reason):
its batched pipeline p2p goes through the default group, whose communicator every rank has used, where
NCCL requires the first ``batch_isend_irecv`` on a group to involve every rank of it.

With the patch, every batched pipeline p2p goes through the default group: ``_batched_p2p_ops`` builds
its ops without a group (0.14-0.19, slime's change), and on 0.16-0.19 ``_communicate_shapes`` sends the
shapes on the default group as well, so shapes and tensors keep sharing one communicator as on 0.14's
shape exchange. The peers are global ranks already: the same tensors reach the same stages. Opt-in:
the pipeline traffic leaves the pipeline group's communicator.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_P2P = "megatron.core.pipeline_parallel.p2p_communication"
_TENSORS = Wrap(f"{_P2P}:_batched_p2p_ops", "._pipeline_p2p_default_group:wrap_batched_p2p_ops")

PATCHES = (
    Patch(
        id="megatron.pipeline_p2p_default_group",
        self_check="._checks.pipeline_p2p_default_group:check_pipeline_p2p_default_group",
        summary=(
            "Batched pipeline-parallel send/receive (_batched_p2p_ops, and from 0.16 the shape exchange) "
            "goes through the default process group instead of the pipeline group."
        ),
        why=(
            "slime drops the group from the four P2POps of _batched_p2p_ops, so pipeline p2p runs on the "
            "default group's communicator; on 0.14-0.15 upstream's shape exchange already does, and NCCL "
            "batched p2p first used on a group by some of its ranks only can hang."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"
            "megatron/core/pipeline_parallel/p2p_communication.py"
        ),
        removal="Remove when the frameworks stop moving pipeline p2p off the pipeline group.",
        opt_in=True,
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="tensors-beside-default-group-shapes",
                requires={"megatron-core": ">=0.14,<0.16"},
                installs=(_TENSORS,),
            ),
            Variant(
                label="tensors-and-shapes",
                requires={"megatron-core": ">=0.16,<0.20"},
                installs=(
                    _TENSORS,
                    Wrap(f"{_P2P}:P2PCommunicator._communicate_shapes",
                         "._pipeline_p2p_default_group:wrap_communicate_shapes"),
                ),
            ),
        ),
    ),
)
