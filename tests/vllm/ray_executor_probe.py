"""Run in a fresh interpreter by the Ray executor tests: install the ``ray`` stand-in (``ray_stand_in``) before
vLLM's executors are imported, apply the named patches (none: vLLM as released), run one probe of
``patchkit/patches/vllm/_checks/_ray_boundary.py`` and print its result as JSON on the last line.

    python ray_executor_probe.py {worker-options|ports|doctor|doctor-upstream} [PATCH_ID ...]
"""

from __future__ import annotations

import json
import sys


def main(probe: str, patch_ids: list[str]) -> object:
    import ray_stand_in

    ray_stand_in.install()
    import vllm_cpu_harness

    vllm_cpu_harness.select_cpu_platform()
    import patchkit

    if patch_ids:
        patchkit.apply_all(enable=patch_ids)
    from patchkit.patches.vllm._checks import _ray_boundary

    if probe == "doctor":  # the patches' self-checks, as `patchkit doctor --patch ...` runs them
        from patchkit.doctor import run

        verdicts, _ = run(patch_ids, device="cpu")
        return {verdict.id: [verdict.verdict, verdict.message] for verdict in verdicts}
    if probe == "doctor-upstream":  # each self-check with upstream's code back while the status says applied
        from patchkit.doctor import run
        from patchkit.runtime.process_engine import engine

        run(patch_ids, device="cpu")  # imports the targets: the patches install
        found = {}
        for patch_id in patch_ids:
            # What selfcheck.upstream_behaviour does, registrations (Call) included: this process ends
            # after the probe, so nothing is put back.
            for action in reversed(engine().installed_actions(patch_id)):
                action.restore()
            (verdict,), _ = run([patch_id], device="cpu")
            found[verdict.id] = [verdict.verdict, verdict.message]
        return found
    if probe == "worker-options":
        options = _ray_boundary.v1_worker_options()
        seen = {"runtime_env": options.get("runtime_env"), "python": sys.executable}
    elif probe == "ports":
        seen = _ray_boundary.store_and_queue_ports(_ray_boundary.free_port_base())
    else:
        raise SystemExit(f"unknown probe {probe!r}")
    # The patches' states once the probe imported their targets (an installed patch was pending until then).
    records = patchkit.apply_all(enable=patch_ids) if patch_ids else []
    return {**seen, "records": {record.id: record.to_dict() for record in records if record.id in patch_ids}}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:]), default=str))
