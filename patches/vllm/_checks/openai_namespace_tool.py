"""Self-check of ``vllm.openai_namespace_tool``: vLLM's tool-parser utilities import with the installed openai,
and a Responses-API function tool goes through vLLM's own ``iter_response_function_tool_info`` (0.25+)."""

from __future__ import annotations

import importlib

from patchkit.selfcheck import CheckContext, expect


def check_openai_namespace_tool(context: CheckContext) -> None:
    """``vllm.tool_parsers.utils`` imports; a function tool is read as one, no tool is a namespace tool."""
    try:
        utils = importlib.import_module("vllm.tool_parsers.utils")
    except ImportError as error:
        expect(False, "vLLM's tool-parser utilities (vllm.tool_parsers.utils) imported", "imported",
               f"ImportError: {error}")
        return
    read = getattr(utils, "iter_response_function_tool_info", None)
    if read is None:  # vLLM 0.24: no namespace tools
        return
    from openai.types.responses import FunctionTool

    tool = FunctionTool(type="function", name="lookup", parameters={"type": "object"}, strict=False)
    expect(read(tool) == [("lookup", {"type": "object"})], "vLLM's reading of a Responses-API function tool",
           [("lookup", {"type": "object"})], read(tool))
    expect(not isinstance(tool, utils.NamespaceTool), "a function tool taken for a namespace tool", False, True)
