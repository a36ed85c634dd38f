"""vLLM's tool-parser utilities importing openai's ``NamespaceTool`` where the installed openai predates it.

Declaration only (see docs/writing-patches.md). From 0.25 ``vllm/tool_parsers/utils.py`` starts with
``from openai.types.responses import FunctionTool, NamespaceTool, ToolChoiceFunction``. ``NamespaceTool``
(a Responses-API tool that groups function tools under a namespace) arrived in openai 2.25.0, yet vLLM
0.25-0.30 declare ``openai>=2.0.0``: with an older openai, which such a trainer pins (nemo-gym:
``openai<=2.7.2``), the import fails, and with it vLLM's OpenAI server and every module that reaches the
tool parsers. vLLM uses the name only in ``isinstance`` checks; an older openai cannot build such a tool,
so a class no object is an instance of answers each check as the real one would. NeMo-RL rewrites the
import on disk (``patches.py``, ``_patch_vllm_tool_parser_namespace_tool``); the patch adds the class to
``openai.types.responses`` instead, when openai predates it.

Ranges: vLLM 0.24's ``tool_parsers/utils.py`` does not import the name (native). 0.25-0.30 with
openai < 2.25: patched, tested on vLLM 0.29.0 with openai 2.7.2. From vLLM 0.31 the requirement is
``openai>=2.25.0``, and an openai that defines the class needs nothing: native, tested on 0.29.0 and
0.33.0 with openai 3.57.0.
"""

from __future__ import annotations

from patchkit import Add, Patch, Variant

PATCHES = (
    Patch(
        id="vllm.openai_namespace_tool",
        self_check="._checks.openai_namespace_tool:check_openai_namespace_tool",
        summary=(
            "vLLM's tool-parser utilities import with an openai older than 2.25: openai.types.responses gets a "
            "NamespaceTool class that no object is an instance of."
        ),
        why=(
            "vLLM 0.25-0.30 import openai's NamespaceTool (openai 2.25+) while accepting openai>=2.0; with an "
            "older openai, vllm.tool_parsers.utils and vLLM's OpenAI server fail to import."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.31.0/requirements/common.txt",
        removal="Drop with vLLM 0.30: from 0.31 vLLM requires openai>=2.25.",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.25"},
                native="vLLM 0.24's tool_parsers/utils.py does not import NamespaceTool",
            ),
            Variant(
                requires={"vllm": ">=0.25,<0.31", "openai": "<2.25"},
                installs=(Add("openai.types.responses:NamespaceTool", "._openai_namespace_tool:NamespaceTool"),),
                label="namespace-tool-stand-in",
            ),
            Variant(
                requires={"vllm": ">=0.25,<0.34", "openai": ">=2.25"},
                native="openai 2.25+ defines NamespaceTool",
            ),
        ),
    ),
)
