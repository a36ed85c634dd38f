"""``_modelopt_plugins.megatron_plugin_problem``: the cause to name when no Megatron linear can be quantized."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from patchkit.patches.modelopt import _modelopt_plugins


def test_no_problem_once_the_plugin_is_loaded():
    # conftest loaded the plugin (under tests/te_harness.py's stub where TE is missing)
    assert _modelopt_plugins.MEGATRON_PLUGIN in sys.modules
    assert _modelopt_plugins.megatron_plugin_problem() is None


_FRESH = """
import modelopt.torch.quantization
from patchkit.patches.modelopt._modelopt_plugins import megatron_plugin_problem, MEGATRON_PLUGIN
import sys
print(MEGATRON_PLUGIN in sys.modules, repr(megatron_plugin_problem()))
"""


def test_a_fresh_process_without_transformer_engine_names_it_on_048():
    from importlib.metadata import version

    from packaging.version import Version

    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _FRESH], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded, problem = done.stdout.strip().splitlines()[-1].split(" ", 1)
    no_te = importlib.util.find_spec("transformer_engine") is None
    if no_te and Version(version("nvidia-modelopt")) >= Version("0.48.0rc0"):
        assert loaded == "False" and "TransformerEngine is not installed" in problem
    else:
        assert loaded == "True" and problem == "None"
