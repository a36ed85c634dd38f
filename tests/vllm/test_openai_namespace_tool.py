"""``vllm.openai_namespace_tool``: vLLM's tool-parser utilities with an openai older than 2.25.

vLLM 0.25-0.30 import ``NamespaceTool`` from ``openai.types.responses`` (openai 2.25+) while accepting
openai>=2.0: environment ``vllm-0.29-openai-2.7`` (openai 2.7.2) runs the patched variant. With openai
2.25+ (every other vLLM environment, openai 3.57.0) and on vLLM 0.24 (no such import) it is native.
Imports are tried in fresh processes: an import that already happened proves nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version

import pytest
from packaging.version import Version

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import Reason
from patchkit.selfcheck import upstream_behaviour

PATCH = "vllm.openai_namespace_tool"
pytestmark = pytest.mark.usefixtures("patches_restored")
VLLM = Version(version("vllm"))
OLD_OPENAI = Version(version("openai")) < Version("2.25")
IMPORTS_IT = VLLM >= Version("0.25")
patched_only = pytest.mark.skipif(not (OLD_OPENAI and IMPORTS_IT), reason="openai defines NamespaceTool, or "
                                  "vLLM 0.24 does not import it (native)")
native_only = pytest.mark.skipif(OLD_OPENAI, reason="openai < 2.25: patched")

IMPORT_VLLMS_SERVER = (
    "import vllm.tool_parsers.utils, vllm.entrypoints.openai.api_server; print('imported')"
)


def _fresh_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", **env})


def test_patched_with_an_openai_before_2_25_and_native_otherwise():
    with patchkit.applied(PATCH) as (record,):
        if OLD_OPENAI and IMPORTS_IT:
            assert record.state.installed and record.variant == "namespace-tool-stand-in", record.to_dict()
        else:
            assert record.reason is Reason.NATIVE, record.to_dict()


@patched_only
def test_vllm_alone_cannot_import_its_tool_parsers_with_this_openai():
    """Upstream pinned: the failure the patch exists for, in a process whose start-up hook skips the patch."""
    done = _fresh_python(IMPORT_VLLMS_SERVER, PATCHKIT_AUTOLOAD="1", PATCHKIT_DISABLE=PATCH)
    assert done.returncode != 0, done.stdout
    assert "cannot import name 'NamespaceTool' from 'openai.types.responses'" in done.stderr, done.stderr[-2000:]


def test_vllms_tool_parsers_and_openai_server_import():
    """In a fresh process with patchkit's start-up hook (``PATCHKIT_AUTOLOAD=1``): patched or native alike."""
    done = _fresh_python(IMPORT_VLLMS_SERVER, PATCHKIT_AUTOLOAD="1")
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-2000:]


@pytest.mark.skipif(not IMPORTS_IT, reason="vLLM 0.24 has no Responses-API namespace tools")
def test_vllm_reads_a_function_tool_and_takes_nothing_for_a_namespace_tool(applied):
    from openai.types.responses import FunctionTool, WebSearchTool
    from vllm.tool_parsers import utils

    function = FunctionTool(type="function", name="lookup", parameters={"type": "object"}, strict=False)
    assert utils.iter_response_function_tool_info(function) == [("lookup", {"type": "object"})]
    assert utils.iter_response_function_tool_info(WebSearchTool(type="web_search")) == []


@patched_only
def test_the_stand_in_cannot_be_built(applied):
    from vllm.tool_parsers import utils

    with pytest.raises(TypeError, match="needs openai>=2.25"):
        utils.NamespaceTool()


@native_only
@pytest.mark.skipif(not IMPORTS_IT, reason="vLLM 0.24 has no Responses-API namespace tools")
def test_vllm_imports_openais_own_namespace_tool(applied):
    """Native with openai 2.25+: nothing installed, vLLM's name is openai's class."""
    from openai.types.responses import NamespaceTool
    from vllm.tool_parsers import utils

    assert not applied.state.installed
    assert utils.NamespaceTool is NamespaceTool and NamespaceTool.__module__.startswith("openai.")


@native_only
@pytest.mark.skipif(IMPORTS_IT, reason="vLLM 0.25+ import NamespaceTool")
def test_vllm_0_24_tool_parsers_do_not_name_namespace_tools(applied):
    from vllm.tool_parsers import utils

    assert not hasattr(utils, "NamespaceTool")


def test_openai_namespace_tool_check_is_verified(applied):
    (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.openai_namespace_tool")
@pytest.mark.skipif(not IMPORTS_IT, reason="vLLM 0.24 does not import NamespaceTool: nothing to take away")
def test_openai_namespace_tool_check_fails_without_namespace_tool(applied, monkeypatch):
    """openai < 2.25: upstream's state (no stand-in); 2.25+: openai's class taken away. The tool-parser module is
    imported anew in each case."""
    import openai.types.responses

    monkeypatch.delitem(sys.modules, "vllm.tool_parsers.utils", raising=False)
    if OLD_OPENAI:
        with upstream_behaviour(PATCH):
            (verdict,) = run([PATCH], device="cpu")[0]
    else:
        monkeypatch.delattr(openai.types.responses, "NamespaceTool")
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "vllm.tool_parsers.utils) imported: expected imported, found ImportError: cannot import name " \
        "'NamespaceTool'" in verdict.message, verdict.message
