"""What ``import patchkit; patchkit.apply_all()`` loads in a fresh interpreter, and what it leaves for later.

Start-up must not grow with the catalogue nor pay for what only an install, a problem or tooling
needs: ``logging`` (nothing can hear a record before it is imported), the declarations (read from
the index as plain data), ``importlib.metadata`` (versions are read from the metadata files), and
the close-match search of a misspelled name and the helpers of implementation modules. Nor the
engine: the first ``apply_all()`` settles every patch from the index (switched off, not installed,
or waiting for its upstream's code) and the engine is built when a target module is imported or
something asks for it; nor ``typing``, ``re``, ``threading`` or ``weakref``, which a bare
interpreter does not import and which cost start-up milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

#: Modules start-up must not import, each for the reason in the module doc.
NOT_AT_STARTUP = ("logging", "importlib.metadata", "difflib", "patchkit.runtime.declaration",
                  "patchkit.patches._index_declarations", "patchkit.runtime.installer", "patchkit.runtime.drift",
                  "patchkit.runtime.probing", "patchkit.runtime.engine", "patchkit.runtime.entries",
                  "patchkit.runtime.jobs", "patchkit.runtime.decision", "patchkit.runtime.catalogue",
                  "patchkit.runtime.versions", "patchkit.runtime.pep440")
#: Standard-library modules a bare interpreter does not import and patchkit's start-up must not add.
STDLIB_NOT_ADDED = ("typing", "re", "threading", "weakref", "contextlib", "fnmatch", "logging")
#: Every module of patchkit that start-up imports: the index reader, the settled states, the hooks.
AT_STARTUP = sorted([
    "patchkit", "patchkit._version", "patchkit.runtime", "patchkit.runtime.distinfo", "patchkit.runtime.errors",
    "patchkit.runtime.forking", "patchkit.runtime.hooks", "patchkit.runtime.import_watch", "patchkit.runtime.index",
    "patchkit.runtime.installed", "patchkit.runtime.logs", "patchkit.runtime.process_engine",
    "patchkit.runtime.records", "patchkit.runtime.settings", "patchkit.runtime.settle", "patchkit.runtime.status",
    "patchkit.patches", "patchkit.patches._index",
])


def _run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    found: dict = json.loads(result.stdout)
    found["stderr"] = result.stderr
    return found


def test_apply_all_imports_no_logging_declarations_or_metadata_while_no_target_is_imported():
    found = _run("""
        import json, sys
        import patchkit
        statuses = patchkit.apply_all()
        loaded = [m for m in %r if m in sys.modules]
        print(json.dumps({"loaded": loaded, "patches": len(statuses)}))
    """ % (NOT_AT_STARTUP,))
    assert found["loaded"] == [] and found["patches"] > 0


def test_start_up_imports_the_index_reader_and_the_hooks_and_builds_no_engine():
    found = _run("""
        import json, sys
        bare = set(sys.modules)
        import patchkit
        statuses = patchkit.apply_all()
        from patchkit.runtime import process_engine
        added = sorted(set(sys.modules) - bare)
        print(json.dumps({"own": [m for m in added if m.startswith("patchkit")], "added": added,
                          "built": process_engine._engine is not None, "patches": len(statuses)}))
    """)
    assert found["own"] == AT_STARTUP
    assert [m for m in STDLIB_NOT_ADDED if m in found["added"]] == []
    assert found["built"] is False and found["patches"] > 0


def test_the_public_names_are_served_on_first_use():
    found = _run("""
        import json, sys
        import patchkit
        patchkit.apply_all()
        names = {name: getattr(patchkit, name).__module__ for name in ("Engine", "Registered", "Patch", "ConfigError")}
        print(json.dumps({"names": names, "all": sorted(n for n in patchkit.__all__ if not hasattr(patchkit, n))}))
    """)
    assert found["names"] == {"Engine": "patchkit.runtime.engine", "Registered": "patchkit.runtime.catalogue",
                              "Patch": "patchkit.runtime.declaration", "ConfigError": "patchkit.runtime.errors"}
    assert found["all"] == []


def test_dir_lists_the_names_served_on_first_use_without_importing_them():
    found = _run("""
        import json, sys
        import patchkit
        listed = dir(patchkit)
        print(json.dumps({"missing": sorted(set(patchkit.__all__) - set(listed)),
                          "engine_imported": "patchkit.runtime.engine" in sys.modules}))
    """)
    assert found["missing"] == [] and found["engine_imported"] is False


def test_the_patchkit_logger_gets_its_null_handler_when_logging_is_imported_later():
    """A catalogue module's own logger sends to the ``patchkit`` namespace without the runtime's
    stand-ins: the NullHandler must be there first, or ``logging.lastResort`` prints to stderr."""
    found = _run("""
        import json, sys
        import patchkit
        patchkit.apply_all()
        assert "logging" not in sys.modules
        import logging
        handlers = [type(h).__name__ for h in logging.getLogger("patchkit").handlers]
        logging.getLogger("patchkit.patches.some_family").warning("heard by no handler")
        print(json.dumps({"handlers": handlers}))
    """)
    assert found["handlers"] == ["NullHandler"]
    assert "heard by no handler" not in found["stderr"]


def test_records_sent_before_logging_is_imported_are_dropped_and_later_ones_reach_handlers():
    found = _run("""
        import json, sys
        from patchkit.runtime import logs
        early = logs.get("patchkit.startup_test")
        early.warning("before logging exists")
        dropped = "logging" not in sys.modules
        import logging, io
        stream = io.StringIO()
        logging.getLogger().addHandler(logging.StreamHandler(stream))
        early.warning("after logging is imported")
        print(json.dumps({"dropped": dropped, "heard": stream.getvalue()}))
    """)
    assert found["dropped"] is True
    assert found["heard"] == "after logging is imported\n"
