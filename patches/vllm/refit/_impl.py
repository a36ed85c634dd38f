"""patchkit's refit of recorded quantized layers (every format in ``_formats``) and of KV-cache
scales (vLLM 0.12-0.33).

The sequence mirrors what vLLM's own layerwise reload (``model_loader/reload``, 0.16+) does for
one layer, done model-wide and all-or-nothing:

1. ``prepare``: put checkpoint-format parameters (recorded class, dims and weight loader) with
   fresh storage in place of the kernel tensors, each loader wrapped to check dtypes, name the
   layer and parameter in errors, and count the elements it writes (``_writes``; vLLM's
   reload counts ``copy_`` too), so a missing or short tensor is caught even where an upstream
   loader copies it without complaint. The parameter objects and wrapped loaders are built at a
   layer's first refit and kept, without storage, for the next.
   Attention layers with a KV-cache method get their scale parameters back through the method's
   own ``create_weights``.
2. the caller runs ``model.load_weights`` (vLLM's loaders fill the staged parameters).
3. ``finish``: check every staged parameter was written in full (placeholders the method never
   reads excepted); run upstream
   ``process_weights_after_loading`` on every staged layer; check the new kernel tensors match the
   old ones; only then copy them into the old kernel tensors (addresses captured by CUDA graphs
   stay valid) and put the old tensor objects back. Any failure before the copy restores every
   layer to its previous kernel tensors; a failure during the copies (or the KV-scale processing
   after them) copies the overwritten values back (``_commit``).

Every other tensor the stream writes (norms, embeddings, unquantized layers, biases) is written in
place by vLLM's loaders; ``_plain`` copies each aside before its first write, so an abort puts
those back too: the whole model, not only the recorded layers, is all-or-nothing.

Each public call runs in a ``_session.RefitCall``: the model is claimed (a second caller gets
``RefitInProgressError``) and signals with Python handlers are held (``_signals``) while patchkit changes the
model: prepare, the checks and processing of finish (with safe points between layers, where a held
signal is delivered and the refit rolled back), the commit (no safe point: a signal lands after the
last copy; any other failure there is undone, ``_commit``) and abort. Only the load phase
lets a signal through at once; the window then rolls the model back before the signal's exception
reaches the interrupted code.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from .._errors import RefitError, RefitInProgressError, UnsupportedQuantizationError
from . import _finite, _plain, _writes
from ._commit import CommitUndo
from ._coverage import describe_key
from ._formats import served_tensors
from ._kv_slots import ServedScales
from ._loaders import counting_loader, get_loader, refuse_without_data, set_loader
from ._session import claimed
from ._signals import SignalWindow
from ._state import (
    STATE_ATTR,
    KernelTensors,
    LayerRefitState,
    LoadLog,
    ParamSpec,
    Staging,
    clear_tensors,
    describe_tensor,
    restore_method_state,
    shape_text,
)

logger = logging.getLogger(__name__)

_KV_STAGING_ATTR = "_patchkit_kv_refit_staging"
_WRITES_ATTR = "_patchkit_refit_write_counting"  #: the refit's hold on _writes
_ALLOW_NON_FINITE_ATTR = "_patchkit_refit_allow_non_finite"  #: this refit takes NaN/Inf (opt-out)
_KV_SCALE_NAMES = ("q_scale", "k_scale", "v_scale", "prob_scale")
#: placeholders compressed-tensors' KV-cache method registers beside the scales (symmetric only: unread)
_KV_ZERO_POINT_NAMES = ("q_zero_point", "k_zero_point", "v_zero_point")
#: destinations a refit tensor must match exactly: ``copy_`` would cast any other dtype into them without
#: a word (E8M0 block scales, ``float8_e8m0fnu``, round a float32 scale to a power of two: 0.7 -> 0.5)
_EXACT_DTYPES = frozenset({torch.uint8, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu})
#: FP8 data, whose values mean something only with their scale: refused into a wider float. (An E8M0 tensor
#: into a float scale converts exactly, powers of two, and stays allowed.)
_SCALED_FLOATS = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})


# --- prepare -------------------------------------------------------------------------------------


def prepare(model: torch.nn.Module, allow_non_finite: bool = False) -> None:
    with claimed(model, _abort):
        _prepare(model, allow_non_finite)


def _prepare(model: torch.nn.Module, allow_non_finite: bool = False) -> None:
    layers = list(_recorded_layers(model))
    kv_layers = list(_kv_scale_layers(model))
    _refuse_unrefittable_layers(model)
    if (
        _plain.is_prepared(model)
        or _WRITES_ATTR in model.__dict__
        or any(state.staging is not None for _, _, state in layers)
        or any(hasattr(layer, _KV_STAGING_ATTR) for _, layer in kv_layers)
    ):
        raise RefitInProgressError("a refit is already prepared on this model; finish or abort it first")
    try:
        # Installed once for the refit, not per loader call (each install rewrites torch.Tensor).
        object.__setattr__(model, _WRITES_ATTR, _writes.hold())
        object.__setattr__(model, _ALLOW_NON_FINITE_ATTR, _finite.allowed(allow_non_finite))
        for name, layer, state in layers:
            _stage_layer(name, layer, state)
        for name, layer in kv_layers:
            _stage_kv_scales(name, layer)
        staged = [p for _, _, state in layers if state.staging is not None for p in state.staging.params.values()]
        staged += [p for _, layer in kv_layers for n in _KV_SCALE_NAMES if (p := layer._parameters.get(n)) is not None]
        _plain.install(model, _plain.guard(model, staged))
    except BaseException:
        _abort(model)
        raise
    logger.debug("prepared refit of %d recorded layers, %d KV-scale layers", len(layers), len(kv_layers))


def _stage_layer(layer_name: str, layer: torch.nn.Module, state: LayerRefitState) -> None:
    if state.staged_params is None:
        # Built once: a vLLM parameter and its wrapped loader cost more to make than the storage.
        state.staged_params = {
            name: _staged_param(layer_name, name, spec, state) for name, spec in state.checkpoint.items()
        }
    # Set first: an abort from here on gives the storage back (``_unstage``).
    state.staging = Staging(params={name: param for name, (param, _) in state.staged_params.items()})
    for name, spec in state.checkpoint.items():
        param, attrs = state.staged_params[name]
        param.data = spec.staging_storage()
        # What the last refit's processing (or anyone) set on the parameter does not carry over.
        param.__dict__.clear()
        param.__dict__.update(attrs)
    clear_tensors(layer)
    state.kernel.move_objects_aside(layer)
    for name, param in state.staging.params.items():
        layer.register_parameter(name, param)


def _staged_param(
    layer_name: str, name: str, spec: ParamSpec, state: LayerRefitState
) -> tuple[torch.nn.Parameter, dict[str, Any]]:
    """A staged parameter and its attribute dict: the recorded one, with a counting loader."""
    param = spec.materialize()

    def log() -> LoadLog:
        assert state.staging is not None, "a staged parameter's loader ran outside its refit"
        return state.staging.log

    set_loader(param, _checked_counting_loader(get_loader(param), layer_name, name, spec.dtype, spec.numel, log))
    return param, dict(param.__dict__)


def _unstage(state: LayerRefitState) -> None:
    """End the layer's refit: its staged parameters let go of their storage."""
    state.staging = None
    for name, (param, _) in (state.staged_params or {}).items():
        spec = state.checkpoint[name]
        param.data = torch.empty(0, dtype=spec.dtype, device=spec.device)


def _stage_kv_scales(layer_name: str, layer: torch.nn.Module) -> None:
    log = LoadLog()
    # The method's own create_weights re-creates the scale parameters with the sentinel value
    # its process_weights_after_loading uses to tell "not in the checkpoint".
    layer.quant_method.create_weights(layer)
    for name in _KV_SCALE_NAMES:
        param = getattr(layer, name, None)
        if isinstance(param, torch.Tensor):
            set_loader(param, _checked_counting_loader(
                get_loader(param), layer_name, name, param.dtype, param.numel(), lambda: log
            ))
    object.__setattr__(layer, _KV_STAGING_ATTR, log)


def _checked_counting_loader(
    original: Callable[..., Any],
    layer_name: str,
    name: str,
    dtype: torch.dtype,
    capacity: int,
    log_of: Callable[[], LoadLog],
) -> Callable[..., Any]:
    """``original`` counting its writes into ``log_of()``, refusing a wrong dtype, naming the layer in errors."""
    return counting_loader(
        original,
        name,
        log_of,
        capacity,
        check=functools.partial(_check_tensor, layer_name, name, dtype),
        on_error=_loader_error(layer_name, name),
    )


def _loader_error(layer_name: str, name: str) -> Callable[[torch.Tensor, torch.Tensor, Exception], RefitError]:
    def error(target: torch.Tensor, loaded_weight: torch.Tensor, exc: Exception) -> RefitError:
        return _mismatch(layer_name, name, target, loaded_weight, str(exc))

    return error


def _mismatch(layer_name: str, name: str, target: torch.Tensor, loaded_weight: torch.Tensor, why: str) -> RefitError:
    """The error for a refit tensor that does not fit its parameter, naming both and ``why``."""
    return RefitError(
        f"refit of layer {layer_name!r}: parameter {name!r} is {describe_tensor(target)}"
        f" but the refit tensor is {describe_tensor(loaded_weight)} ({why})",
        layer=layer_name,
        parameter=name,
        expected=describe_tensor(target),
        got=describe_tensor(loaded_weight),
    )


def _check_tensor(
    layer_name: str, name: str, dtype: torch.dtype, target: torch.Tensor, loaded_weight: torch.Tensor
) -> None:
    """Refuse a refit tensor without data (``RefitDeviceError``) or of the wrong dtype, before the loader runs."""
    refuse_without_data(layer_name, name, target, loaded_weight)
    _check_dtype(layer_name, name, dtype, target, loaded_weight)


def _check_dtype(
    layer_name: str, name: str, dtype: torch.dtype, target: torch.Tensor, loaded_weight: torch.Tensor
) -> None:
    # A copy_ into uint8/fp8/e8m0 storage would silently cast floats; scales may arrive in any float. An FP8
    # tensor into a wider float (an online-FP8 layer's bf16 weight) would be cast without its scale.
    # ``dtype`` is the destination's, recorded: reading it off a vLLM parameter costs a
    # __torch_function__ round trip per checkpoint tensor.
    exact = dtype in _EXACT_DTYPES
    ok = (loaded_weight.dtype == dtype if exact
          else loaded_weight.is_floating_point() and loaded_weight.dtype not in _SCALED_FLOATS)
    if not ok:
        must = dtype if exact else "a floating type other than FP8 (E4M3/E5M2)"
        raise _mismatch(layer_name, name, target, loaded_weight, f"dtype must be {must}")


# --- finish --------------------------------------------------------------------------------------


def finish(model: torch.nn.Module) -> None:
    with claimed(model, _abort) as call:
        _finish(model, call.window)


@torch.no_grad()
def _finish(model: torch.nn.Module, window: SignalWindow) -> None:
    layers = [entry for entry in _recorded_layers(model) if entry[2].staging is not None]
    kv_layers = [(name, layer) for name, layer in _kv_scale_layers(model) if hasattr(layer, _KV_STAGING_ATTR)]
    try:
        _check_all_loaded(layers)
        if not model.__dict__.get(_ALLOW_NON_FINITE_ATTR, False):
            _check_finite(layers)
        processed = []
        for name, layer, state in layers:
            window.safe_point()  # a signal held so far rolls the refit back here
            processed.append((layer, state, _process(name, layer, state)))
        window.safe_point()
        # No safe point from here on: a signal during the copies is delivered after the last one
        # (the model then serves the new weights in full). Any other failure is undone.
        undo = CommitUndo()
        try:
            while processed:  # each layer's new tensors are dropped once copied (_commit: memory)
                layer, state, fresh = processed.pop(0)
                _commit(layer, state, fresh, undo)
            for name, layer in kv_layers:
                _commit_kv_scales(name, layer, undo)
        except BaseException:
            undo.rollback()
            raise
        undo.discard()
        plain = _plain.take(model)
        if plain is not None:
            plain.release()
        _release_write_counting(model)
    except BaseException:
        _abort(model)
        raise
    logger.debug("refit committed on %d recorded layers, %d KV-scale layers", len(layers), len(kv_layers))


def _check_all_loaded(layers: list[tuple[str, torch.nn.Module, LayerRefitState]]) -> None:
    """Each checkpoint parameter ``create_weights`` registered must be written in full, every element
    by exactly one refit tensor (placeholders the method never reads excepted), whether the model's
    first load was real or dummy (``_coverage``)."""
    for layer_name, _, state in layers:
        assert state.staging is not None
        log = state.staging.log
        for name, spec in state.checkpoint.items():
            coverage = log.coverage.get(name)
            param = state.staging.params[name]
            if coverage is not None and coverage.doubled:
                doubled = "; ".join(sorted({describe_key(key) for key in coverage.doubled}))
                missing = coverage.missing(param, spec.required)
                also = f", and {missing} of its {spec.required} elements were not written" if missing else ""
                raise RefitError(
                    f"refit of layer {layer_name!r}: parameter {name!r} ({spec.describe()}) was written twice"
                    f" by refit tensors for the same place ({doubled}){also}: a tensor was sent twice, under"
                    " its own name or another's",
                    layer=layer_name,
                    parameter=name,
                    expected="each part written once",
                    got=f"written twice ({doubled})",
                )
            missing = coverage.missing(param, spec.required) if coverage is not None else spec.required
            if not missing:
                continue
            copied = spec.required - missing
            seen = ", ".join(shape_text(s) for s in log.shapes.get(name, []))
            got = f"{copied} of {spec.required} elements" + (f" from refit tensors of shape {seen}" if seen else "")
            raise RefitError(
                f"refit of layer {layer_name!r}: parameter {name!r} ({spec.describe()}) was not"
                f" loaded in full: {got}",
                layer=layer_name,
                parameter=name,
                expected=spec.describe(),
                got=got if copied else "missing",
            )


def _check_finite(layers: list[tuple[str, torch.nn.Module, LayerRefitState]]) -> None:
    """Refuse a staged parameter holding NaN or infinity (``_finite``), naming layer and parameter."""
    for layer_name, _, state in layers:
        assert state.staging is not None
        for name, param in state.staging.params.items():
            if name not in state.staging.log.coverage:
                continue  # an unread placeholder the refit did not send
            bad = _finite.non_finite(name, param)
            if bad is not None:
                raise RefitError(
                    f"refit of layer {layer_name!r}: parameter {name!r} ({describe_tensor(param)}) holds {bad};"
                    f" nothing was changed. To load it anyway, as vLLM does, pass allow_non_finite=True"
                    f" (or set {_finite.ALLOW_ENV}=1)",
                    layer=layer_name,
                    parameter=name,
                    expected="finite values",
                    got=bad,
                )


def _process(layer_name: str, layer: torch.nn.Module, state: LayerRefitState) -> KernelTensors:
    """Run upstream processing on the staged parameters; return the new kernel tensors."""
    method = layer.quant_method
    try:
        method.process_weights_after_loading(layer)
    except RefitError as exc:  # a format's hook refused a staged tensor
        raise RefitError(
            f"refit of layer {layer_name!r}: {exc}",
            layer=layer_name,
            parameter=exc.parameter,
            expected=exc.expected,
            got=exc.got,
        ) from exc
    except Exception as exc:
        raise RefitError(
            f"refit of layer {layer_name!r}: upstream process_weights_after_loading failed: {exc}",
            layer=layer_name,
        ) from exc
    fresh = KernelTensors.of(layer, served_tensors(method, layer))
    for name, old in state.kernel.items():
        new = fresh.get(name)
        if new is None or new.shape != old.shape or new.dtype != old.dtype:
            raise RefitError(
                f"refit of layer {layer_name!r}: kernel tensor {name!r} is {describe_tensor(old)}"
                f" but processing produced {'nothing' if new is None else describe_tensor(new)}",
                layer=layer_name,
                parameter=name,
                expected=describe_tensor(old),
                got="missing" if new is None else describe_tensor(new),
            )
    # Put the serving tensors back now; the copy waits until every layer has processed.
    state.kernel.place_on(layer)
    restore_method_state(method, state.method_state)
    return fresh


@torch.no_grad()
def _commit(layer: torch.nn.Module, state: LayerRefitState, fresh: KernelTensors, undo: CommitUndo) -> None:
    for name, old in state.kernel.items():
        new = fresh.get(name)
        if new is not None and new is not old:
            undo.copy(old, new)
    _unstage(state)


def _commit_kv_scales(layer_name: str, layer: torch.nn.Module, undo: CommitUndo) -> None:
    log: LoadLog = object.__getattribute__(layer, _KV_STAGING_ATTR)
    object.__delattr__(layer, _KV_STAGING_ATTR)
    if log.loaded():
        # Upstream copies into the _k_scale/_v_scale/... buffers in place and deletes the params;
        # compressed-tensors' method puts new tensors there instead: the serving ones are kept.
        served = ServedScales.of(layer)
        undo.save_scales(layer, after=lambda: (served.put_back(), _drop_kv_scale_params(layer)))
        layer.quant_method.process_weights_after_loading(layer)
        served.keep(layer_name, undo)
    else:
        # No scales in this refit: keep the ones in use (processing would reset them to 1.0).
        _drop_kv_scale_params(layer)


# --- one call ------------------------------------------------------------------------------------


def refit_weights(
    model: torch.nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    load_weights: Callable[[Iterable[tuple[str, torch.Tensor]]], Any] | None,
    allow_non_finite: bool = False,
) -> None:
    load = load_weights if load_weights is not None else _default_loader(model)
    current: list[str] = []
    producer_errors: list[BaseException] = []

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        iterator = iter(weights)
        while True:
            try:
                name, tensor = next(iterator)
            except StopIteration:
                return
            except BaseException as exc:
                # The producer's own error (an exporter's QATExportError, say) is not about loading.
                producer_errors.append(exc)
                raise
            current[:] = [name]
            yield name, tensor

    with claimed(model, _abort) as call:
        _prepare(model, allow_non_finite)
        try:
            with call.window.interruptible():
                load(stream())
        except BaseException as exc:
            if not call.window.closed:  # closed: an interrupt has rolled back and let the model go
                _abort(model)
            error = _loading_error(exc, current, producer_errors)
            if error is exc:
                raise
            raise error from exc
        call.check_not_interrupted()
        _finish(model, call.window)


def _loading_error(exc: BaseException, current: list[str], producer_errors: list[BaseException]) -> BaseException:
    """What a failed load raises: ``exc`` itself when it is a RefitError, the producer's own error or
    not an Exception (an interrupt); otherwise a RefitError naming the tensor being loaded."""
    if isinstance(exc, RefitError) or not isinstance(exc, Exception) or any(exc is e for e in producer_errors):
        return exc
    # vLLM's loaders raise ValueError/KeyError for a name the model does not have, and shape
    # asserts for tensors they cannot place; say which tensor it was.
    name = current[0] if current else None
    layer, _, parameter = (name or "").rpartition(".")
    return RefitError(
        f"refit tensor {name!r} could not be loaded into the model: {exc}; no layer was changed",
        layer=layer or None,
        parameter=parameter or None,
        got="a name the model does not have" if isinstance(exc, (KeyError, ValueError)) else None,
    )


def _default_loader(model: torch.nn.Module) -> Callable[[Iterable[tuple[str, torch.Tensor]]], Any]:
    load_weights = getattr(model, "load_weights", None)
    if callable(load_weights):
        return load_weights  # type: ignore[no-any-return]
    from vllm.model_executor.models.utils import AutoWeightsLoader

    return AutoWeightsLoader(model).load_weights


# --- abort ---------------------------------------------------------------------------------------


def abort(model: torch.nn.Module) -> None:
    with claimed(model, _abort):
        _abort(model)


def _abort(model: torch.nn.Module) -> None:
    """Put back what the model served before ``prepare``: recorded layers' kernel tensors, KV scales, plain tensors."""
    plain = _plain.take(model)
    try:
        for _, layer, state in _recorded_layers(model):
            if state.staging is not None:
                state.kernel.place_on(layer)
                restore_method_state(layer.quant_method, state.method_state)
                _unstage(state)
        for _, layer in _kv_scale_layers(model):
            if hasattr(layer, _KV_STAGING_ATTR):
                object.__delattr__(layer, _KV_STAGING_ATTR)
                _drop_kv_scale_params(layer)
    finally:
        _release_write_counting(model)
        if plain is not None:
            plain.restore()


def _release_write_counting(model: torch.nn.Module) -> None:
    model.__dict__.pop(_ALLOW_NON_FINITE_ATTR, None)
    hold = model.__dict__.pop(_WRITES_ATTR, None)
    if hold is not None:
        hold.release()


@contextlib.contextmanager
def refitting(model: torch.nn.Module, allow_non_finite: bool = False) -> Iterator[None]:
    """The ``with refit(model)`` block: prepare, the block (interruptible), finish; abort on error."""
    with claimed(model, _abort) as call:
        _prepare(model, allow_non_finite)
        try:
            with call.window.interruptible():
                yield
        except BaseException:
            if not call.window.closed:
                _abort(model)
            raise
        call.check_not_interrupted()
        _finish(model, call.window)


# --- model walking -------------------------------------------------------------------------------


def _recorded_layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, LayerRefitState]]:
    for name, module in model.named_modules():
        state = module.__dict__.get(STATE_ATTR)
        if state is not None:
            yield name, module, state


def _kv_scale_layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    for name, module in model.named_modules():
        if isinstance(getattr(module, "quant_method", None), BaseKVCacheMethod):
            yield name, module


def _refuse_unrefittable_layers(model: torch.nn.Module) -> None:
    """Refuse, before any write, a layer whose quant method patchkit cannot refit (``_formats``):
    one of a recorded format that its patch did not record, or whose patch was reverted since it
    recorded it, or one of any other quantization."""
    import patchkit

    from ._formats import describe_method, loads_in_place, recording_patch, supported

    installed: dict[str, bool] = {}

    def is_installed(patch_id: str) -> bool:
        if patch_id not in installed:
            installed[patch_id] = patchkit.why_not_installed(patch_id) is None
        return installed[patch_id]

    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        recorded = STATE_ATTR in module.__dict__
        if not recorded and loads_in_place(method):
            continue
        described = describe_method(module, method)
        patch_id = recording_patch(method, module)
        if recorded:
            if patch_id is None or is_installed(patch_id):
                continue
            raise RefitError(
                f"layer {name!r} ({described}) was recorded by patch {patch_id!r}, which is no longer"
                " installed (reverted or switched off), so a refit through it is refused; apply it again"
                " (patchkit.apply_all()) to refit this layer. Nothing was changed",
                layer=name,
            )
        if patch_id is not None:
            raise RefitError(
                f"layer {name!r} ({described}) was processed before patchkit recorded"
                f" it; apply patchkit (patch {patch_id!r}: patchkit.apply_all(), or the vLLM plugin)"
                " before the model is loaded",
                layer=name,
            )
        raise UnsupportedQuantizationError(
            f"layer {name!r} uses {described}, which patchkit cannot refit (its processed kernel"
            f" tensors would be overwritten with checkpoint tensors); a refit supports {supported()}."
            " Nothing was changed",
            layer=name,
            method=described,
            supported=supported(),
        )


def _drop_kv_scale_params(layer: torch.nn.Module) -> None:
    for name in _KV_SCALE_NAMES + _KV_ZERO_POINT_NAMES:
        if name in layer._parameters:
            del layer._parameters[name]
