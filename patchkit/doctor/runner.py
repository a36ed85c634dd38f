"""``patchkit doctor``: run every applied (or native) patch's self-check on the stack installed here.

``patchkit status`` says whether code was installed; the doctor says whether it does the job. It
applies what applies on the installed upstreams (opt-in patches included: the doctor is a diagnostic
process, not the user's job), then runs each selected patch's declared self-check
(:mod:`patchkit.selfcheck`) with a time limit, and gives one verdict per patch:

- ``verified``: the check passed (for a native patch: upstream does the job);
- ``failed``: the check's expectation failed, it raised, it timed out, or the patch failed to install;
- ``not_applicable``: the patch does not apply here (the skip reason says why), or declares no check;
- ``needs_gpu``: the check runs only on CUDA and the doctor runs on the CPU;
- ``blocked``: the patch's upstream does not import here (an environment problem, reported once
  with its fix by :mod:`.environment`), so nothing of it could be checked.

A check runs in a daemon thread: one that hangs is reported ``failed`` after its time limit and the
others still run (the hung thread is abandoned; ``patchkit doctor`` ends its process without waiting for it).
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import logging
import os
import sys
import threading
import time
import traceback
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from ..runtime.catalogue import Registered
from ..runtime.declaration import Patch, Replace, Wrap
from ..runtime.drift import RecordSource
from ..runtime.engine import Engine
from ..runtime.errors import ConfigError, UnknownPatchError
from ..runtime.status import PatchStatus, Reason, State
from ..selfcheck import CheckContext, MissingDependency, NeedsGPU, SelfCheckFailed
from ..upstream_output import Captured, captured
from . import environment

logger = logging.getLogger(__name__)

VERIFIED = "verified"
FAILED = "failed"
NOT_APPLICABLE = "not_applicable"
NEEDS_GPU = "needs_gpu"
BLOCKED = "blocked"

#: Seconds one self-check may take before it is reported failed.
DEFAULT_TIMEOUT = 120.0


class Verdict(NamedTuple):
    """One patch's doctor result."""

    id: str
    verdict: str
    message: str
    status: PatchStatus
    seconds: float = 0.0
    fingerprints: Mapping[str, Mapping[str, str | None]] = {}
    #: What upstream code printed while the check ran (captured only when ``run(quiet=...)``).
    upstream_output: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "verdict": self.verdict, "message": self.message, "seconds": round(self.seconds, 3),
                "state": self.status.state.value, "reason": self.status.reason.value if self.status.reason else None,
                "variant": self.status.variant, "versions": dict(self.status.versions),
                "fingerprints": {target: dict(facts) for target, facts in self.fingerprints.items()},
                "upstream_output_lines": len(self.upstream_output.splitlines())}


def select(registered: Sequence[Registered], patterns: Sequence[str]) -> list[Registered]:
    """The registered patches matching any glob; an unmatched glob is an error with the closest ids."""
    if not patterns:
        return list(registered)
    ids = [r.patch.id for r in registered]
    for pattern in patterns:
        if not fnmatch.filter(ids, pattern):
            raise UnknownPatchError("--patch", pattern, difflib.get_close_matches(pattern, ids, n=3, cutoff=0.5))
    return [r for r in registered if any(fnmatch.fnmatchcase(r.patch.id, p) for p in patterns)]


def resolve_device(requested: str) -> str:
    """``auto`` is ``cuda`` when torch is installed and sees a GPU, else ``cpu``. ``cuda`` where torch
    cannot use CUDA is a ``ConfigError`` saying why, before anything runs."""
    if requested not in ("auto", "cpu", "cuda"):
        raise ConfigError("--device", requested, "auto, cpu or cuda")
    if requested == "cpu":
        return requested
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        if requested == "cuda":
            raise ConfigError("--device", requested, "auto or cpu", problem="unavailable (torch is not installed)")
        return "cpu"
    import torch  # type: ignore[import-not-found,unused-ignore]

    available = bool(getattr(torch, "cuda", None) is not None and torch.cuda.is_available())
    if requested == "cuda" and not available:
        built = getattr(getattr(torch, "version", None), "cuda", None)
        why = (f"torch {torch.__version__} is built without CUDA" if not built
               else f"torch {torch.__version__} (CUDA {built}) sees no GPU")
        raise ConfigError("--device", requested, "auto or cpu", problem=f"unavailable ({why})")
    return "cuda" if available else "cpu"


def upstream_of(patch: Patch) -> str | None:
    """The upstream a patch belongs to: its first distribution other than torch."""
    dists = patch.distributions
    return next((d for d in dists if d != "torch"), dists[0] if dists else None)


def _check_function(registered: Registered) -> Callable[[CheckContext], None] | None:
    from ..runtime.installer import resolve_reference

    reference = registered.patch.self_check
    if reference is None:
        return None
    function: Callable[[CheckContext], None] = resolve_reference(reference, registered.package)
    return function


def _run_with_timeout(function: Callable[[], None], timeout: float) -> BaseException | None:
    """Run ``function`` in a daemon thread; its exception, a ``TimeoutError``, or None."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            function()
        except BaseException as exc:  # noqa: B036 - reported as the check's failure, whatever it is
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, name="patchkit-doctor-check", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return TimeoutError(f"the self-check did not finish within {timeout:g} s")
    return outcome[0]


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the enclosed torch work on one intra-op thread, then restore the process's setting.

    Self-checks build tiny models (hidden size 64): splitting their matmuls over threads only adds
    synchronisation, and on a busy machine OpenMP's spinning workers made the Megatron checks about
    8x slower in wall time (2 cores at load 18: 18 s -> 2.3 s for five checks; see CHANGELOG).
    Entered in the thread that runs the check, because torch's intra-op setting is per thread under
    OpenMP. Does nothing when torch is not imported.
    """
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "set_num_threads"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _single_threaded(function: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with one_torch_thread():
            function()

    return run


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SelfCheckFailed):
        return str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename.rsplit(os.sep, 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"the self-check raised {type(exc).__name__}: {exc}{where}"


def fingerprints(patch: Patch, status: PatchStatus, matrix: RecordSource = None) -> dict[str, dict[str, str | None]]:
    """Each Replace/Wrap target's installed fingerprint and how it compares with the variant's records.

    The records are the ones the engine's drift check uses (``matrix``: the engine's source; None,
    the index shipped with patchkit, so no YAML is read), compared the same way.
    """
    if status.variant is None:
        return {}
    from ..runtime import drift

    try:
        variant = patch.variant(status.variant)
    except KeyError:
        return {}
    found: dict[str, dict[str, str | None]] = {}
    try:
        recorded = drift.recorded_fingerprints(patch.id, variant, matrix)
    except Exception:  # informative only: a malformed explicit matrix is the engine's to report
        recorded = {}
    for action in variant.installs:
        if not isinstance(action, (Replace, Wrap)):
            continue
        try:
            value = drift.current_fingerprint(action.target)
        except Exception:  # a fingerprint is informative; failing to take one is not a verdict
            value = None
        known = recorded.get(action.target, frozenset())
        match = ("unknown" if value is None or not known else "recorded" if value in known else "drifted")
        if status.reason is not None and status.reason.value == "code_identical" and match == "recorded":
            match = "code_identical"
        found[action.target] = {"fingerprint": value, "match": match}
    return found


def examine(registered: Registered, status: PatchStatus, device: str, timeout: float,
            matrix: RecordSource = None) -> Verdict:
    """The verdict for one patch, given its status after applying."""
    patch = registered.patch
    if status.state is State.FAILED:
        return Verdict(patch.id, FAILED, f"the patch failed to install: {status.error or status.detail}", status)
    native = status.reason is Reason.NATIVE
    if not (status.state.installed or native):
        reason = status.reason.value if status.reason else status.state.value
        return Verdict(patch.id, NOT_APPLICABLE, f"{reason}: {status.detail}".rstrip(": "), status)
    prints = fingerprints(patch, status, matrix)
    try:
        check = _check_function(registered)
    except Exception as exc:
        return Verdict(patch.id, FAILED, f"cannot load the self-check: {exc!r}", status, 0.0, prints)
    if check is None:
        return Verdict(patch.id, NOT_APPLICABLE, "the patch declares no self-check", status, 0.0, prints)
    context = CheckContext(patch.id, device, native)
    started = time.perf_counter()
    error = _run_with_timeout(_single_threaded(lambda: check(context)), timeout)
    seconds = time.perf_counter() - started
    if error is None:
        what = "upstream does the job (native)" if native else "the patch does the job"
        return Verdict(patch.id, VERIFIED, what, status, seconds, prints)
    if isinstance(error, NeedsGPU):
        return Verdict(patch.id, NEEDS_GPU, str(error), status, seconds, prints)
    if isinstance(error, MissingDependency):
        return Verdict(patch.id, NOT_APPLICABLE, str(error), status, seconds, prints)
    return Verdict(patch.id, FAILED, _describe(error), status, seconds, prints)


def run(patterns: Sequence[str] = (), device: str = "auto", timeout: float = DEFAULT_TIMEOUT,
        progress: IO[str] | None = None, engine: Engine | None = None,
        quiet: IO[str] | None = None) -> tuple[list[Verdict], dict[str, Any]]:
    """Apply, then check every selected patch. Returns the verdicts and the run's facts.

    ``engine`` defaults to the process-wide one, applied as ``patchkit.apply_all()`` applies it
    (``PATCHKIT_EXTRA_PATCHES`` included). Selected opt-in patches are applied too, and the targets of
    every selected patch imported, so that what is checked is what a job enabling them would run.

    With ``quiet`` (a stream for patchkit's own warnings), what upstreams print while they are
    imported and while each check runs is captured (:mod:`patchkit.upstream_output`): each verdict carries its check's,
    the facts carry the import phase's (``upstream_output``).
    """
    import patchkit

    def capturing() -> contextlib.AbstractContextManager[Captured]:
        return captured(quiet) if quiet is not None else contextlib.nullcontext(Captured())

    started = time.perf_counter()
    with capturing() as during_apply:
        if engine is None:
            patchkit.apply_all()
            engine = patchkit.engine()
        else:
            engine.apply_all()
        selected = select([Registered(engine.patch(i), engine.package(i)) for i in engine.ids()], patterns)
        device = resolve_device(device)
        upstreams = {r.patch.id: upstream_of(r.patch) for r in selected}
        problems: list[environment.Problem] = []
        optional: dict[str, environment.OptionalDependency] = {}
        unavailable: dict[str, environment.OptionalDependency] = {}
        if selected:
            ids = [r.patch.id for r in selected]
            engine.apply(*ids)  # opt-ins among them included: they wait for their modules now
            known = {i: d for i, d in upstreams.items() if d}
            problems = environment.import_upstreams(engine.status(*ids), known, progress, optional)
            # A patch of a module that needs a package nobody installed here stays waiting: a job
            # without that package never imports the module, so the patch never applies.
            unavailable = {s.id: optional[m] for s in engine.status(*ids) for m in s.waiting_for if m in optional}
            with environment.said_once(problems, known):
                engine.apply(*[i for i in ids if i not in unavailable], import_targets=True)
    statuses = {s.id: s for s in engine.status()}
    import_seconds = time.perf_counter() - started
    verdicts = []
    for registered in selected:
        if progress is not None:
            progress.write(f"doctor: {registered.patch.id} ...")
            progress.flush()
        blocking = environment.blocked_by(statuses[registered.patch.id], upstreams[registered.patch.id], problems)
        with capturing() as during_check:
            if blocking is not None:
                verdict = Verdict(registered.patch.id, BLOCKED, f"blocked: {blocking.distribution} does not import "
                                  "(environment problem)", statuses[registered.patch.id])
            elif registered.patch.id in unavailable:
                needs = unavailable[registered.patch.id]
                verdict = Verdict(registered.patch.id, NOT_APPLICABLE, f"{needs.module} imports only with "
                                  f"{needs.missing}, which is not installed here", statuses[registered.patch.id])
            else:
                verdict = examine(registered, statuses[registered.patch.id], device, timeout, engine.matrix)
        verdict = verdict._replace(upstream_output=during_check.text)
        verdicts.append(verdict)
        if progress is not None:
            progress.write(f"\rdoctor: {registered.patch.id}: {verdict.verdict} ({verdict.seconds:.1f} s)\n")
            progress.flush()
    dists = {d for r in engine.ids() for d in engine.patch(r).distributions}
    facts = {"device": device, "python": sys.version.split()[0], "patchkit": patchkit.__version__,
             "stack": environment.stack(dists), "environment": [p.to_dict() for p in problems],
             "import_and_apply_seconds": round(import_seconds, 3),
             "total_seconds": round(time.perf_counter() - started, 3), "upstream_output": during_apply.text}
    return verdicts, facts


def exit_status(verdicts: Iterable[Verdict]) -> int:
    """1 if any verdict failed or is blocked by the environment, else 0."""
    return 1 if any(v.verdict in (FAILED, BLOCKED) for v in verdicts) else 0


def abandoned_checks() -> bool:
    """True when a timed-out check's thread is still running (the process should ``os._exit``)."""
    return any(t.name == "patchkit-doctor-check" and t.is_alive() for t in threading.enumerate())
