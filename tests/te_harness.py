"""A documented TransformerEngine *import* harness for tests on machines without CUDA.

TransformerEngine (TE) cannot be installed without CUDA. Two upstreams import it at module level
although the code under test never runs a TE kernel:

* **Megatron-Bridge** imports ``transformer_engine.pytorch`` in ``peft/lora.py`` and
  ``peft/lora_layers.py`` (reached from ``import megatron.bridge``): it subclasses ``te.Linear``,
  names ``te.ops.Sequential`` in annotations, and from 0.5 reads
  ``inspect.signature(te.pytorch.GroupedLinear.__init__)`` at import.
* **ModelOpt 0.48** (``quantization/plugins/megatron.py``) imports its TE plugin unconditionally
  (0.47 guarded it with ``if HAS_TE:``). Without TE the ``ModuleNotFoundError`` is swallowed by
  ModelOpt's ``import_plugin`` and the Megatron linears are never registered with
  ``QuantModuleRegistry``, so nothing in a Megatron model can be quantized. The TE plugin only
  registers TE classes at import (``QuantModuleRegistry.register({te.pytorch.Linear: ...})``) and
  patches TE functionals when a TE module runs, which the tests' local-spec models never do.

What the stub provides: ``transformer_engine`` (``__version__ = "0.0.0"``, so version probes such as
``is_te_min_version`` answer "too old" and TE-only features stay off), ``transformer_engine.pytorch``
with empty ``torch.nn.Module`` classes ``Linear``, ``LayerNormLinear``, ``GroupedLinear``,
``ops.Sequential``, and the modules ``transformer_engine.pytorch.module.{linear, layernorm_linear,
grouped_linear}`` with the names ModelOpt's TE plugin reads at import (``_Linear``,
``_LayerNormLinear``, ``_GroupedLinear``, the public classes).

Scope: the stub is in ``sys.modules`` only while the upstream that needs it is first imported, after
the megatron-core modules that probe for TE (``MEGATRON_CORE_FIRST``) were imported without it, so
megatron-core keeps seeing no TransformerEngine (``HAVE_TE = False``). It is removed afterwards. A
real TransformerEngine, when installed, is always used instead.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from typing import Iterator

import torch

#: megatron-core modules imported before the stub exists, so their TE probes see the truth.
MEGATRON_CORE_FIRST = (
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.post_training.modelopt.gpt.model_specs",
    "megatron.core.extensions.transformer_engine",
    "megatron.core.transformer.moe.experts",
    "megatron.core.utils",
)
#: ModelOpt's Megatron plugin: the module whose import registers Megatron's linears for quantization.
MODELOPT_MEGATRON_PLUGIN = "modelopt.torch.quantization.plugins.megatron"


def _module_class(module: types.ModuleType, name: str) -> type:
    cls = type(name, (torch.nn.Module,), {"__module__": module.__name__})
    setattr(module, name, cls)
    return cls


def _stub_modules() -> dict[str, types.ModuleType]:
    def package(name: str) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__path__ = []  # a package, so submodule imports resolve through sys.modules
        return module

    te = package("transformer_engine")
    te.__version__ = "0.0.0"
    pytorch = package("transformer_engine.pytorch")
    ops = types.ModuleType("transformer_engine.pytorch.ops")
    module = package("transformer_engine.pytorch.module")
    linear = types.ModuleType("transformer_engine.pytorch.module.linear")
    layernorm_linear = types.ModuleType("transformer_engine.pytorch.module.layernorm_linear")
    grouped_linear = types.ModuleType("transformer_engine.pytorch.module.grouped_linear")
    pytorch.Linear = linear.Linear = _module_class(linear, "Linear")
    pytorch.LayerNormLinear = layernorm_linear.LayerNormLinear = _module_class(layernorm_linear, "LayerNormLinear")
    pytorch.GroupedLinear = grouped_linear.GroupedLinear = _module_class(grouped_linear, "GroupedLinear")
    for functional, home in (("_Linear", linear), ("_LayerNormLinear", layernorm_linear),
                             ("_GroupedLinear", grouped_linear)):
        setattr(home, functional, type(functional, (torch.autograd.Function,), {"__module__": home.__name__}))
    _module_class(ops, "Sequential")
    pytorch.ops, pytorch.module, te.pytorch = ops, module, pytorch
    module.linear, module.layernorm_linear, module.grouped_linear = linear, layernorm_linear, grouped_linear
    return {m.__name__: m for m in (te, pytorch, ops, module, linear, layernorm_linear, grouped_linear)}


def is_stub(module: object) -> bool:
    """Whether ``module`` is this harness's stand-in (stubs have no ``__file__``)."""
    return isinstance(module, types.ModuleType) and not hasattr(module, "__file__")


def real_transformer_engine_installed() -> bool:
    present = sys.modules.get("transformer_engine")
    if present is not None:
        return not is_stub(present)
    return importlib.util.find_spec("transformer_engine") is not None


@contextlib.contextmanager
def te_import_stub() -> Iterator[None]:
    """Import megatron-core first, then let TE-importing upstream modules load, then remove the stub."""
    if is_stub(sys.modules.get("transformer_engine")):
        yield  # already stubbed by an outer context
        return
    for name in MEGATRON_CORE_FIRST:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if real_transformer_engine_installed():
        yield  # a real TransformerEngine is installed: use it
        return
    stubs = _stub_modules()
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, stub in stubs.items():
            if sys.modules.get(name) is stub:
                del sys.modules[name]


#: The name Megatron-Bridge's tests have always used.
bridge_import_context = te_import_stub


def bridge_peft_without_te() -> None:
    """Tell Megatron-Bridge's PEFT utilities that TransformerEngine is not installed, where it is not.

    Without TE, megatron-core 0.19 gives its ``TE*`` wrapper names mock objects, which Bridge's
    ``peft.utils`` imports successfully: its ``HAVE_TE`` is then true and LoRA's ``isinstance`` tests
    against those names raise ``TypeError``. With the flag false, LoRA wraps Megatron's local linears,
    as it does on a machine where Bridge sees no TE. Nothing changes where a real TE is installed.
    """
    if real_transformer_engine_installed():
        return
    import megatron.bridge.peft.utils as peft_utils

    peft_utils.HAVE_TE = False


def load_modelopt_megatron_plugin() -> bool:
    """Make sure ModelOpt's Megatron plugin is loaded; load it under the stub where only TE was missing.

    Returns whether the stub was needed. ModelOpt 0.47 and earlier load the plugin without TE and
    this is a no-op; 0.48 drops it silently without TE, and it is imported again here with the stub.
    """
    import modelopt.torch.quantization  # noqa: F401  (stock import: tries the plugin itself)

    if MODELOPT_MEGATRON_PLUGIN in sys.modules or importlib.util.find_spec("megatron.core") is None:
        return False
    with te_import_stub(), _megatron_te_classes_as_placeholders():
        importlib.import_module(MODELOPT_MEGATRON_PLUGIN)
    return True


@contextlib.contextmanager
def _megatron_te_classes_as_placeholders() -> Iterator[None]:
    """Give megatron-core's TE wrapper names (``TELinear``, ...) class placeholders while the plugin loads.

    Without TE, megatron-core 0.19 defines ``te = MagicMock()`` and its ``TE*`` wrappers become mocks,
    which ModelOpt's ``QuantModuleRegistry.register`` refuses (not an ``nn.Module`` subclass): the
    plugin would stop after registering the first Megatron linears. The plugin only uses them as
    registry keys; the placeholders are classes no model builds, and the real names come back after.
    """
    from megatron.core.extensions import transformer_engine as mcore_te

    replaced = {name: value for name, value in vars(mcore_te).items()
                if name.startswith("TE") and not isinstance(value, type)}
    for name in replaced:
        setattr(mcore_te, name, type(name, (torch.nn.Module,), {"__module__": "te_harness.placeholders"}))
    try:
        yield
    finally:
        for name, value in replaced.items():
            setattr(mcore_te, name, value)
