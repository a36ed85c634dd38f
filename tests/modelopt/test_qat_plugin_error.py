"""ModelOpt's Megatron plugin failing to load is named as such, not as "no linear layer"."""

from __future__ import annotations

import sys

import pytest
from modelopt.torch.quantization.nn import QuantModuleRegistry
from patchkit.patches.modelopt.qat import ModelOptPluginError, QATConfigError, apply_qat
from patchkit.patches.modelopt.qat import _plugins as _qat_plugins

PLUGIN_LOADED = sys.modules.get(_qat_plugins.MEGATRON_PLUGIN) is not None


@pytest.mark.skipif(PLUGIN_LOADED, reason="ModelOpt's Megatron plugin loaded here (ModelOpt < 0.48 or TE installed)")
def test_real_modelopt_without_its_megatron_plugin_names_the_plugin_and_the_cause(tiny_moe_gpt):
    model = tiny_moe_gpt()
    expected = r"Megatron plugin \(modelopt\.torch\.quantization\.plugins\.megatron\) failed to load"
    with pytest.raises(ModelOptPluginError, match=expected) as info:
        apply_qat(model)
    assert isinstance(info.value, QATConfigError)
    assert info.value.cause is info.value.__cause__
    assert "ColumnParallelLinear" in info.value.available
    assert info.value.missing_module is None or info.value.missing_module.startswith("transformer_engine")


def test_a_plugin_that_failed_to_import_is_reported_with_the_missing_module(tiny_moe_gpt, monkeypatch):
    """Simulated on releases whose plugin loads: unregistered Megatron linears, plugin import failing."""
    model = tiny_moe_gpt()
    missing = ModuleNotFoundError("No module named 'transformer_engine'", name="transformer_engine")
    monkeypatch.setitem(sys.modules, _qat_plugins.MEGATRON_PLUGIN, None)
    monkeypatch.setattr(_qat_plugins, "import_megatron_plugin", lambda: missing)
    monkeypatch.setattr(type(QuantModuleRegistry), "__contains__", lambda self, cls: False)
    with pytest.raises(ModelOptPluginError, match="module 'transformer_engine' is not installed") as info:
        apply_qat(model)
    assert info.value.missing_module == "transformer_engine" and info.value.__cause__ is missing
    assert {"ColumnParallelLinear", "RowParallelLinear"} <= set(info.value.available)


def test_a_model_without_megatron_layers_does_not_blame_the_plugin(monkeypatch):
    import torch

    monkeypatch.setitem(sys.modules, _qat_plugins.MEGATRON_PLUGIN, None)
    with pytest.raises(QATConfigError, match="no linear layer") as info:
        apply_qat(torch.nn.Sequential(torch.nn.LayerNorm(16)))
    assert not isinstance(info.value, ModelOptPluginError)


_FRESH = """
import sys
import modelopt.torch.quantization
from megatron.core.tensor_parallel.layers import ColumnParallelLinear
from patchkit.patches.modelopt.qat._plugins import MEGATRON_PLUGIN, megatron_plugin_failure
print(MEGATRON_PLUGIN in sys.modules, repr(megatron_plugin_failure({ColumnParallelLinear})))
"""


def test_a_fresh_process_without_transformer_engine_finds_the_plugin_missing_on_048():
    """Real ModelOpt, no harness: 0.48 drops its Megatron plugin without TransformerEngine, and the cause is found."""
    import importlib.util
    import subprocess
    from importlib.metadata import version

    from packaging.version import Version

    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _FRESH], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded, failure = done.stdout.strip().splitlines()[-1].split(" ", 1)
    no_te = importlib.util.find_spec("transformer_engine") is None
    if no_te and Version(version("nvidia-modelopt")) >= Version("0.48.0rc0"):
        assert loaded == "False" and "transformer_engine" in failure
    else:
        assert loaded == "True" and failure == "None"
