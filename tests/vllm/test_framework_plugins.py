"""patchkit's ``verl.plugins`` and ``sglang.srt.plugins`` entry points, loaded as verl and SGLang load them.

Neither framework is installed here: each test runs, in a fresh interpreter with patchkit installed,
a faithful copy of the framework's own loader (the entry points come from this package's installed
metadata, through ``importlib.metadata.entry_points`` as the framework calls it), then reads
``patchkit.status``. The loaders copied, line for line in what they do with an entry point:

- verl: ``verl/__init__.py`` (verl-project/verl at 1dda039b, 2026-08-22), run at ``import verl``:
  ``VERL_USE_EXTERNAL_PLUGINS`` (``auto`` default, ``none``, or a comma-separated list of names),
  ``entry_points(group="verl.plugins")``, ``ep.load()`` only, every exception logged at debug.
- SGLang: ``python/sglang/srt/plugins/__init__.py`` (sgl-project/sglang at 32c764af),
  ``load_plugins()``: ``load_plugins_by_group("sglang.srt.plugins")`` (``SGLANG_PLUGINS`` a
  comma-separated allow-list, ``ep.load()``), then each loaded object is called.

The patch looked at is ``vllm.nvfp4_refit`` (vLLM is installed, not imported): ``registered`` until
``apply_all`` runs, then ``pending`` (it waits for its target module), or ``skipped`` when disabled.
"""

from __future__ import annotations

import textwrap
from importlib.metadata import entry_points

import pytest
from fresh_process import last_printed

PATCH = "vllm.nvfp4_refit"

VERL_LOADER = """
import logging, os
_plugins_policy = os.getenv("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
if _plugins_policy != "none":
    from importlib.metadata import entry_points as _entry_points

    _discovered = _entry_points(group="verl.plugins")
    if _plugins_policy == "auto":
        _allowed = None
    else:
        _allowed = {name.strip() for name in _plugins_policy.split(",") if name.strip()}
    for _ep in _discovered:
        if _allowed is not None and _ep.name not in _allowed:
            continue
        try:
            _ep.load()
        except Exception as _e:
            logging.getLogger("verl").debug("Failed to load plugin '%s': %s", _ep.name, _e)
"""

SGLANG_LOADER = """
import logging, os
from importlib.metadata import entry_points
logger = logging.getLogger("sglang.srt.plugins")
allowed_str = os.environ.get("SGLANG_PLUGINS", "")
allowed_set = {x.strip() for x in allowed_str.split(",") if x.strip()} if allowed_str else None
plugins = {}
for ep in entry_points(group="sglang.srt.plugins"):
    if allowed_set is not None and ep.name not in allowed_set:
        continue
    try:
        plugins[ep.name] = ep.load()
    except Exception:
        logger.exception("Failed to load plugin %s", ep.name)
for name, func in plugins.items():
    try:
        func()
    except Exception:
        logger.exception("Failed to execute general plugin: %s", name)
"""


def run_loader(loader: str, **env: str) -> dict:
    """Run ``loader`` in a fresh interpreter, then report ``PATCH``'s status there."""
    script = loader + textwrap.dedent(
        f"""
        import json, patchkit
        record = patchkit.status({PATCH!r})[0]
        print(json.dumps({{"state": record.state.value, "reason": record.reason and record.reason.value}}))
        """
    )
    return last_printed(script, without=("PATCHKIT_", "VERL_", "SGLANG_", "VLLM_PLUGINS"), timeout=120, **env)


APPLIED = {"state": "pending", "reason": None}
NOT_APPLIED = {"state": "registered", "reason": None}


def test_the_installed_metadata_registers_patchkit_in_each_hosts_group():
    from patchkit.patches.entry_points import ENTRY_POINT_NAME, GROUPS

    from patchkit._version import DISTRIBUTION_NAME

    for group in GROUPS.values():
        (found,) = [ep for ep in entry_points(group=group) if ep.dist and ep.dist.name == DISTRIBUTION_NAME]
        assert found.name == ENTRY_POINT_NAME, group
    assert GROUPS == {"vllm": "vllm.general_plugins", "sglang": "sglang.srt.plugins", "verl": "verl.plugins"}


def test_nothing_applies_without_a_loader():
    # The baseline the other tests are measured against, and: importing the entry-point module applies nothing.
    assert run_loader("import patchkit.patches.entry_points\n") == NOT_APPLIED


@pytest.mark.parametrize("policy", [None, "auto", "patchkit", "other_plugin, patchkit"])
def test_import_verl_applies_patchkit(policy):
    env = {} if policy is None else {"VERL_USE_EXTERNAL_PLUGINS": policy}
    assert run_loader(VERL_LOADER, **env) == APPLIED


@pytest.mark.parametrize("policy", ["none", "other_plugin"])
def test_verl_policies_without_patchkit_skip_it(policy):
    assert run_loader(VERL_LOADER, VERL_USE_EXTERNAL_PLUGINS=policy) == NOT_APPLIED


@pytest.mark.parametrize("allowed", [None, "patchkit", "other_plugin,patchkit"])
def test_sglang_load_plugins_applies_patchkit(allowed):
    env = {} if allowed is None else {"SGLANG_PLUGINS": allowed}
    assert run_loader(SGLANG_LOADER, **env) == APPLIED


def test_sglang_plugins_without_patchkit_skips_it():
    assert run_loader(SGLANG_LOADER, SGLANG_PLUGINS="other_plugin") == NOT_APPLIED


@pytest.mark.parametrize("loader", [VERL_LOADER, SGLANG_LOADER], ids=["verl", "sglang"])
def test_patchkit_disable_is_honoured(loader):
    assert run_loader(loader, PATCHKIT_DISABLE=PATCH) == {"state": "skipped", "reason": "disabled"}


@pytest.mark.parametrize("loader", [VERL_LOADER, SGLANG_LOADER], ids=["verl", "sglang"])
@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_patchkit_autoload_off_makes_the_entry_points_stand_aside(loader, value):
    assert run_loader(loader, PATCHKIT_AUTOLOAD=value) == NOT_APPLIED


@pytest.mark.parametrize("loader", [VERL_LOADER, SGLANG_LOADER], ids=["verl", "sglang"])
def test_a_bad_toggle_does_not_stop_the_framework(loader):
    # A malformed PATCHKIT_* value: nothing applied, the reason recorded, the host starts.
    assert run_loader(loader, PATCHKIT_DISABLE="vllm..refit") == {"state": "skipped", "reason": "config_error"}
    assert run_loader(loader, PATCHKIT_AUTOLOAD="maybe") == {"state": "skipped", "reason": "config_error"}


def test_the_vllm_entry_point_honours_autoload_off_too():
    from importlib.metadata import entry_points as eps

    loader = textwrap.dedent(
        """
        from importlib.metadata import entry_points
        for ep in entry_points(group="vllm.general_plugins"):
            if ep.name == "patchkit":
                ep.load()()
        """
    )
    assert any(ep.name == "patchkit" for ep in eps(group="vllm.general_plugins"))
    assert run_loader(loader) == APPLIED
    assert run_loader(loader, PATCHKIT_AUTOLOAD="0") == NOT_APPLIED
