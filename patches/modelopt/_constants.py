"""Values the ModelOpt patches, their helpers and the QAT API share.

A leaf module: it imports nothing from the family, so the CPU backend, the QAT config builder and
the declarations read the same name without an import cycle.
"""

from __future__ import annotations

#: Name under which the CPU backend is registered with ModelOpt.
CPU_BACKEND_NAME = "patchkit_nvfp4_cpu"
