"""Ray: the ``runtime_env`` that makes actors and tasks autoload, and a check across actors.

Ray starts its workers itself, from the raylet's environment rather than the driver's; the
``env_vars`` of a ``runtime_env`` are how a framework gets variables into them. Nothing here
imports Ray: the helpers build dicts and call methods on handles the caller passes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .launcher import autoload_variables
from .manifest import Manifest, collect

if TYPE_CHECKING:
    from .consistency import Report

#: The method :func:`check_actors` calls on each actor (see :class:`ManifestReporter`).
MANIFEST_METHOD = "patchkit_manifest"


def runtime_env(base: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``base`` (a runtime_env dict, or None) with ``env_vars`` that make workers autoload as the
    driver is configured: ``PATCHKIT_AUTOLOAD=1`` and the driver's ``PATCHKIT_*`` variables.

    Variables already in ``base["env_vars"]`` win: a framework may configure its actors on purpose.
    Raises ``ConfigError`` for a malformed ``PATCHKIT_*`` value in the driver.
    """
    merged = dict(base or {})
    merged["env_vars"] = {**autoload_variables(environ), **dict(merged.get("env_vars") or {})}
    return merged


class ManifestReporter:
    """Mix into an actor class so :func:`check_actors` can ask it for its manifest."""

    def patchkit_manifest(self) -> dict[str, Any]:
        return collect().to_dict()


def gather(actors: Iterable[Any], *, method: str = MANIFEST_METHOD, include_driver: bool = True) -> list[Manifest]:
    """The manifests of the driver (first, if ``include_driver``) and of each actor."""
    ray = importlib.import_module("ray")  # the caller runs Ray already; needed only to wait on the calls

    pending = [getattr(actor, method).remote() for actor in actors]
    manifests = []
    if include_driver:
        driver = collect()
        manifests.append(Manifest(driver.entries, {**driver.process, "name": "driver"}, driver.autoload))
    for index, data in enumerate(ray.get(pending)):
        manifest = Manifest.from_dict(data)
        # Actors have no rank: name them by their position, as the caller passed them.
        manifests.append(Manifest(manifest.entries, {**manifest.process, "name": f"actor {index}"},
                                  manifest.autoload))
    return manifests


def check_actors(actors: Iterable[Any], *, method: str = MANIFEST_METHOD, include_driver: bool = True,
                 **options: Any) -> "Report":
    """``patchkit.processes.consistency.check`` over the driver and these actors; ``options`` as for ``check``."""
    from .consistency import check

    return check(gather(actors, method=method, include_driver=include_driver), **options)
