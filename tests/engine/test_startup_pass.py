"""The first ``patchkit.apply_all()`` of a process, settled from the catalogue's index without the engine.

It must record exactly what the engine's own ``apply_all()`` records, whatever the toggles say, and
hand every call it cannot settle to the engine: a configuration problem still reaches the user as a
``PatchkitWarning`` with no logging configured, strict mode still raises. Each case runs in a fresh
interpreter, once through ``patchkit.apply_all()`` and once through the engine directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

FIRST_CALL = """
    import json, sys, warnings
    warnings.simplefilter("always")
    import patchkit
    from patchkit.runtime import process_engine
    try:
        statuses = [s.to_dict() for s in {call}]
    except patchkit.PatchkitError as exc:
        statuses = type(exc).__name__
    built = process_engine._engine is not None
    later = [s.to_dict() for s in patchkit.status()]
    print(json.dumps({{"statuses": statuses, "built": built, "later": later}}))
"""


def _run(call: str, env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(FIRST_CALL.format(call=call))],
                            capture_output=True, text=True, timeout=120, env={**clean, **env})
    assert result.returncode == 0, result.stderr
    found: dict = json.loads(result.stdout)
    found["warnings"] = sorted(line for line in result.stderr.splitlines() if "PatchkitWarning" in line)
    return found


#: Toggles the start-up pass settles itself: the engine is not built by apply_all().
SETTLED = [{}, {"PATCHKIT_DISABLE": "megatron.*"}, {"PATCHKIT_OPT_IN": "*"}, {"PATCHKIT_ENABLE": "vllm.*,bridge.*"},
           {"PATCHKIT_FORCE": "*", "PATCHKIT_MANIFEST_DIR": ""}, {"PATCHKIT_OPT_IN": "megatron.mtp_postprocess"}]
#: Calls it leaves to the engine: a problem to say, strict mode, a log level.
LEFT_TO_THE_ENGINE = [{"PATCHKIT_DISABLE": ",,"}, {"PATCHKIT_DISABLED": "megatron.mtp_postprocess"},
                      {"PATCHKIT_OPT_IN": "no.such_patch"}, {"PATCHKIT_STRICT": "1"}, {"PATCHKIT_LOG_LEVEL": "DEBUG"},
                      {"PATCHKIT_STRICT": "maybe"}]


def _name(env: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in env.items()) or "no toggle"


@pytest.mark.parametrize("env", SETTLED + LEFT_TO_THE_ENGINE, ids=_name)
def test_the_first_apply_all_records_what_the_engine_records(env):
    first = _run("patchkit.apply_all()", env)
    engine = _run("patchkit.engine().apply_all()", env)
    assert first["statuses"] == engine["statuses"]
    assert first["later"] == engine["later"]
    assert first["warnings"] == engine["warnings"]
    assert first["built"] is (env not in SETTLED)


def test_a_configuration_problem_reaches_the_user_as_a_warning_without_logging():
    found = _run("patchkit.apply_all()", {"PATCHKIT_DISABLED": "megatron.mtp_postprocess"})
    assert len(found["warnings"]) == 1 and "did you mean PATCHKIT_DISABLE" in found["warnings"][0]


def test_explicit_arguments_go_to_the_engine():
    found = _run("patchkit.apply_all(disable='megatron.*')", {})
    assert found["built"] is True
    megatron = [s for s in found["statuses"] if s["id"].startswith("megatron.")]
    assert megatron and {s["reason"] for s in megatron} <= {"disabled", "opt_in"}
    assert "disabled" in {s["reason"] for s in megatron}


def test_a_second_apply_all_before_the_engine_is_built_settles_the_same():
    found = _run("[patchkit.apply_all(), patchkit.apply_all()][1]", {})
    assert found["built"] is False
    assert found["statuses"] == found["later"]
