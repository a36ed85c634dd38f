"""The ``NamespaceTool`` that ``openai.types.responses`` gets where the installed openai predates 2.25."""

from __future__ import annotations


class NamespaceTool:
    """openai 2.25's Responses-API namespace tool, for an openai that cannot build one.

    vLLM only asks ``isinstance(tool, NamespaceTool)``; no tool an older openai parses is one, and this
    class has no instances either, so every such check answers False, as it would with the real class.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("NamespaceTool needs openai>=2.25; this openai predates namespace tools")
