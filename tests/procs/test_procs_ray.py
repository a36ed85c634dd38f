"""A real local Ray cluster: actors started with ``patchkit.processes.ray.runtime_env()`` autoload; one
started without it is caught by the check. One driver process, one cluster, for the whole module:
Ray's start-up is the slow part."""

from __future__ import annotations

import json
import textwrap

import pytest
from procs_toy import TOY_PATCHES

pytest.importorskip("ray")

DRIVER = textwrap.dedent("""
    import json, sys
    import ray
    import patchkit.processes.autoload, patchkit.processes.ray
    from patchkit.processes.consistency import ManifestMismatchError

    patchkit.processes.autoload.load()  # the driver applies in code; its workers learn of it only via runtime_env
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)


    @ray.remote
    class Worker(patchkit.processes.ray.ManifestReporter):
        def forward(self):
            from pkproc_toy.core import Model
            return Model().forward(1)


    with_env = Worker.options(runtime_env=patchkit.processes.ray.runtime_env()).remote()
    without_env = Worker.remote()
    forward = ray.get([with_env.forward.remote(), without_env.forward.remote()])
    matching = patchkit.processes.ray.check_actors([with_env])
    caught = patchkit.processes.ray.check_actors([with_env, without_env])
    try:
        patchkit.processes.ray.check_actors([without_env], strict=True)
        strict = "passed"
    except ManifestMismatchError as exc:
        strict = "raised"
    ray.shutdown()
    sys.stdout.write(json.dumps({"forward": forward, "matching": matching.to_dict(), "caught": caught.to_dict(),
                                 "strict": strict}))
""")


@pytest.fixture(scope="module")
def cluster_run(toy, tmp_path_factory):
    result = toy.python(DRIVER, timeout=300, RAY_DISABLE_USAGE_STATS="1", OMP_NUM_THREADS="1", **TOY_PATCHES)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_an_actor_started_with_the_runtime_env_has_the_drivers_manifest(cluster_run):
    assert cluster_run["forward"][0] == 1001
    assert cluster_run["matching"]["ok"], cluster_run["matching"]["text"]
    assert cluster_run["matching"]["processes"] == ["driver", "actor 0"]


def test_an_actor_started_without_it_is_caught(cluster_run):
    assert cluster_run["forward"][1] == 2
    caught = cluster_run["caught"]
    assert caught["differing_processes"] == ["actor 1"]
    found = [(d["process"], d["patch"], d["field"], d["found"]) for d in caught["differences"]]
    assert ("actor 1", "toy.forward", "presence", "absent") in found
    # The actor never ran apply_all: catalogue patches the driver skipped are only 'registered' there.
    assert {state for _, patch, field, state in found if field == "state"} <= {"registered"}
    assert cluster_run["strict"] == "raised"


def test_runtime_env_carries_the_drivers_toggles_and_keeps_the_frameworks_own(monkeypatch):
    import patchkit.processes.ray

    monkeypatch.setenv("PATCHKIT_DISABLE", "toy.other")
    monkeypatch.setenv("PATCHKIT_EXTRA_PATCHES", "pkproc_toy.patches")
    env = patchkit.processes.ray.runtime_env({"pip": ["x"], "env_vars": {"PATCHKIT_DISABLE": "toy.forward", "A": "1"}})
    assert env["pip"] == ["x"]
    assert env["env_vars"] == {"PATCHKIT_AUTOLOAD": "1", "PATCHKIT_DISABLE": "toy.forward",
                               "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.patches", "A": "1"}


def test_runtime_env_refuses_a_malformed_driver_value(monkeypatch):
    import patchkit.processes.ray
    from patchkit import ConfigError

    monkeypatch.setenv("PATCHKIT_ENABLE", "toy..forward")
    with pytest.raises(ConfigError, match="PATCHKIT_ENABLE"):
        patchkit.processes.ray.runtime_env()


def test_runtime_env_carries_the_catalogues_choice_variables(monkeypatch):
    import patchkit.processes.ray

    monkeypatch.setenv("PATCHKIT_MTP_OUTPUT_HEAD", "trained")
    monkeypatch.setenv("PATCHKIT_MTP_WITHOUT_LABELS", "derive")
    env = patchkit.processes.ray.runtime_env()
    assert env["env_vars"] == {"PATCHKIT_AUTOLOAD": "1", "PATCHKIT_MTP_OUTPUT_HEAD": "trained",
                               "PATCHKIT_MTP_WITHOUT_LABELS": "derive"}


def test_runtime_env_refuses_a_bad_choice_in_the_driver(monkeypatch):
    import patchkit.processes.ray
    from patchkit import ConfigError

    monkeypatch.setenv("PATCHKIT_MTP_OUTPUT_HEAD", "frozen")
    with pytest.raises(ConfigError, match="PATCHKIT_MTP_OUTPUT_HEAD"):
        patchkit.processes.ray.runtime_env()
