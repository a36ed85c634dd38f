"""Setting up a whole process tree to autoload: the environment, and ``patchkit run``.

Autoload travels through the environment, the one thing every launcher passes on to the processes
it starts (``multiprocessing``, torchrun, Ray, vLLM). The variables are validated here, in the
launcher, so a typo fails once, loudly, before a job starts hundreds of processes that would each
only log it.
"""

from __future__ import annotations

import logging
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from ..runtime import settings
from .autoload import ACTIVE_MARKER

logger = logging.getLogger(__name__)

#: The start-up hook's file name, as setup.py installs it at the root of site-packages.
HOOK_NAME = "zz_patchkit_autoload.pth"


def autoload_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``PATCHKIT_*`` variables a process must inherit to autoload as this one is configured:
    every ``PATCHKIT_*`` variable set here, and ``PATCHKIT_AUTOLOAD=1``.

    Raises ``ConfigError`` for a malformed value, naming the variable and the accepted forms.
    """
    env = os.environ if environ is None else environ
    validate(env)
    # The catalogue's choice variables travel too: an MTP option set in the driver must hold in
    # every rank and Ray actor, not only where it was typed.
    chosen = {name: value for name, value in env.items() if name in settings.VARIABLES or name in settings.CHOICES}
    chosen[settings.AUTOLOAD] = "1"
    return chosen


def validate(environ: Mapping[str, str]) -> None:
    """Parse every ``PATCHKIT_*`` variable the way the processes will; raise on the first bad one."""
    settings.from_environment(environ)
    settings.parse_modules(settings.EXTRA_PATCHES, environ.get(settings.EXTRA_PATCHES, ""))
    settings.parse_bool(settings.AUTOLOAD, environ.get(settings.AUTOLOAD, ""))
    for variable in settings.CHOICES:
        settings.choice(variable, environ)


def environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full environment for a process tree that autoloads: ``environ`` plus autoload."""
    env = dict(os.environ if environ is None else environ)
    env.update(autoload_variables(env))
    env.pop(ACTIVE_MARKER, None)
    return env


def hook_installed() -> Path | None:
    """Where this interpreter's site-packages holds the start-up hook, or None."""
    folders = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
    for folder in dict.fromkeys(folders):
        candidate = Path(folder) / HOOK_NAME
        if candidate.is_file():
            return candidate
    return None


#: Exit statuses for a command that cannot be started, as a POSIX shell gives them.
NOT_EXECUTABLE_STATUS = 126
NOT_FOUND_STATUS = 127


def run(command: Sequence[str], environ: Mapping[str, str] | None = None, *, replace_process: bool = True) -> int:
    """Run ``command`` with autoload on for it and every process it starts; return its exit status.

    On POSIX the launcher process becomes ``command`` (exec), so signals and exit status are the
    command's own; elsewhere, or with ``replace_process=False``, it waits for a child process. A
    command that cannot be started gets one line on stderr and a shell's status: 127 if it is not
    found (an empty name included), 126 if it is found but cannot be run (not executable, a folder).
    """
    if not command:
        raise ValueError("patchkit run needs a command, e.g. `patchkit run -- python train.py`")
    env = environment(environ)
    if hook_installed() is None:
        logger.warning("patchkit: the start-up hook %s is not in this interpreter's site-packages: processes "
                       "will not autoload (install patchkit with pip, not by adding it to PYTHONPATH)", HOOK_NAME)
    name = command[0]
    if not name:
        return _cannot_start(name, "command not found", NOT_FOUND_STATUS)
    try:
        if replace_process and os.name == "posix":
            sys.stdout.flush()
            sys.stderr.flush()
            os.execvpe(name, list(command), env)
        return subprocess.call(list(command), env=env)
    except FileNotFoundError:
        return _cannot_start(name, "command not found", NOT_FOUND_STATUS)
    except OSError as exc:  # PermissionError, IsADirectoryError, ENOEXEC...
        if os.path.isdir(name):
            return _cannot_start(name, "is a directory", NOT_EXECUTABLE_STATUS)
        return _cannot_start(name, exc.strerror or type(exc).__name__, NOT_EXECUTABLE_STATUS)


def _cannot_start(name: str, why: str, status: int) -> int:
    logger.error("patchkit run: %s: %s", why, name or "''")
    return status
