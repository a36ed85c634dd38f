"""``compat_matrix.yaml``: what patchkit was verified on, read, checked and written back.

Nothing here is imported by ``import patchkit`` or by ``apply_all()`` when no patch installs: the
engine loads the matrix only when a variant is about to install (see :mod:`patchkit.runtime.drift`).

    schema     validating the file, with line:column positions
    loader     finding and loading it (checkout or installed wheel), cached
    check      registry and matrix agree
    record     write an environment's versions and fingerprints back
    static     verify versions from downloaded release artifacts, without installing them
    table      the README's supported-versions table
"""

from __future__ import annotations

from .loader import default_path, load
from .model import Environment, Matrix, TargetRecord, VersionRecord
from .schema import MatrixError

__all__ = ["Environment", "Matrix", "MatrixError", "TargetRecord", "VersionRecord", "default_path", "load"]
