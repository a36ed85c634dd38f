"""The runtime's copy of the matrix's records: ``patchkit/runtime/_recorded.py``, generated here.

The engine compares installed code with recorded fingerprints when a variant installs (drift) and
when a release lies beyond every variant's range (code identity). It must not read YAML or import
this tooling to do that (``import yaml`` and the schema cost more than the whole start-up budget),
so the records it needs are written into a plain Python data module, loaded from its cached
bytecode: per patch and variant, each record's versions, status and target fingerprints. Nothing
else of the matrix (environments, signatures, notes) is copied.

``patchkit matrix record`` and ``static`` rewrite it whenever they rewrite the shipped matrix;
``patchkit matrix check`` (CI) fails when it is out of step; ``patchkit matrix index`` rewrites it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Union

from ..runtime.errors import PatchkitError
from .model import Matrix

logger = logging.getLogger(__name__)

#: The generated module, beside the runtime that reads it.
PATH = Path(__file__).resolve().parents[1] / "runtime" / "_recorded.py"

HEADER = '''# ruff: noqa: E501
"""Generated from compat_matrix.yaml by `patchkit matrix index` (also run by `record` and `static`).

Do not edit: `patchkit matrix check` fails when this is out of step with the matrix. Read by
patchkit.runtime.drift: RECORDS[patch id][variant name] is a tuple of records, each
(versions as sorted (distribution, version) pairs, status, sorted (target, fingerprint or None) pairs).
"""

'''


def records(matrix: Matrix) -> dict[str, dict[str, tuple[Any, ...]]]:
    """The index's content: plain tuples, sorted, so its text is deterministic."""
    from .writer import record_order

    return {
        patch_id: {
            variant: tuple(
                (tuple(sorted(r.versions.items())), r.status,
                 tuple(sorted((t, found.fingerprint) for t, found in r.targets.items())))
                for r in sorted(found_records, key=record_order)
            )
            for variant, found_records in sorted(variants.items())
        }
        for patch_id, variants in sorted(matrix.patches.items()) if variants
    }


def render(matrix: Matrix) -> str:
    from ..runtime.fingerprint import FORMAT

    # One line per patch: a recording changes the lines of the patches it touched, and the records
    # of neighbouring patches never read as a repeated block of the same shape.
    lines = [HEADER.rstrip("\n"), "", f"FORMAT = {FORMAT}", "", "RECORDS = {"]
    lines.extend(f"    {patch_id!r}: {variants!r}," for patch_id, variants in records(matrix).items())
    lines.append("}")
    return "\n".join(lines) + "\n"


def is_shipped(path: Path) -> bool:
    """Whether ``path`` is the matrix shipped with patchkit (the one the index mirrors)."""
    from .loader import default_path

    shipped = default_path()
    return shipped is not None and shipped.resolve() == Path(path).resolve()


#: What :func:`records` returns: patch id -> variant name -> records (the runtime's ``drift.Index``).
Records = dict[str, dict[str, tuple[Any, ...]]]


def source(matrix: Union[str, "os.PathLike[str]", Matrix]) -> Callable[[bool], "Records | None"]:
    """The records of another matrix, for ``Engine(matrix=...)`` (tests, embedders): a function the
    engine calls with ``strict`` when a patch first installs, so the file is read only then.

    A missing file means no records (drift unknown, logged at debug level). A malformed one is
    logged as an error and means no records too, unless strict: then its ``MatrixError`` is raised.
    """
    def records_of(strict: bool) -> Records | None:
        from . import loader

        if isinstance(matrix, Matrix):
            return records(matrix)
        try:
            return records(loader.load(matrix))
        except FileNotFoundError:
            logger.debug("patchkit: no compatibility matrix at %s; drift is not checked", matrix)
            return None
        except PatchkitError:
            if strict:
                raise
            logger.error("patchkit: the compatibility matrix is malformed; drift is not checked", exc_info=True)
            return None

    return records_of
