"""Record upstream megatron-core 0.17+'s attached MTP losses into ``fixtures/mtp_loss_upstream.json``.

Run inside an environment with megatron-core 0.17 or later, unpatched (the numbers must be
upstream's ``process_mtp_loss``)::

    .nox/tests-mcore-0-19/bin/python tests/megatron/make_mtp_loss_fixture.py

``test_mtp_loss_normalisation.py`` replays the stored inputs on every release: patchkit's MTP
postprocess must attach the same losses (on 0.14-0.16 this is the proof of its per-token
normalisation), and on 0.17+ upstream itself must still produce them.
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from packaging.version import Version  # noqa: E402

logger = logging.getLogger("make_mtp_loss_fixture")


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    mcore = version("megatron-core")
    if Version(mcore) < Version("0.17"):
        raise SystemExit(f"megatron-core {mcore}: the reference numbers must come from 0.17+ (process_mtp_loss)")
    from cpu_harness import cpu_megatron, destroy_parallel_state, initialize_parallel_state
    from mtp_loss_reference import CASES, attached_losses, build_model, make_inputs, write_fixture
    from tiny_gpt import VOCAB_SIZE

    inputs = make_inputs(VOCAB_SIZE)
    with cpu_megatron():
        initialize_parallel_state()
        try:
            cases = {
                (depths, per_token): attached_losses(build_model(depths, per_token, inputs["output_weight"]), inputs)
                for depths, per_token in CASES
            }
        finally:
            destroy_parallel_state()
    for (depths, _), losses in cases.items():
        assert len(losses) == depths, f"{depths} depths attached {len(losses)} losses"
    write_fixture({"megatron_core": mcore, "torch": version("torch")}, inputs, cases)
    logger.info("wrote %d cases from megatron-core %s", len(cases), mcore)


if __name__ == "__main__":
    main()
