"""Ships patchkit's start-up hook at the root of site-packages: a ``.pth`` file, and its PEP 829
``.start`` twin with the small module it names.

Everything else about the package is declared in pyproject.toml; this file exists only because
setuptools has no declarative way to put a file outside a package. ``build_py`` writes the hook
next to the packages in ``build_lib`` (so ``pip install .`` and wheels carry it); for an editable
install (PEP 660) setuptools keeps only what its own editable strategy generates from ``build_lib``,
so the hook is written straight into the editable wheel's root, which ``editable_wheel`` exposes as
the ``install`` command's ``install_lib``.

Which file runs: Python 3.15+ (PEP 829) calls the entry point of ``<name>.start`` and, because a
``.start`` file of the same name exists, ignores the ``import`` line of ``<name>.pth``; older Pythons
do not know ``.start`` files and run the ``.pth`` line. Either way the hook runs once, and
``run_at_startup`` itself runs at most once per process.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

#: Sorts after ``__editable__.*.pth`` and most path-extending ``.pth`` files of the same folder, so
#: upstreams installed in editable mode are importable by the time patchkit decides what applies.
HOOK_NAME = "zz_patchkit_autoload.pth"

#: One line, run by ``site`` at every interpreter start. With PATCHKIT_AUTOLOAD unset it costs one
#: dictionary lookup: ``os`` is already imported by ``site``, and nothing of patchkit is imported.
HOOK_LINE = (
    "import os; 'PATCHKIT_AUTOLOAD' in os.environ and "
    "__import__('patchkit.processes.autoload').processes.autoload.run_at_startup()\n"
)

#: The PEP 829 twin of HOOK_NAME: same stem, so that a Python that reads it skips the ``.pth`` line.
START_NAME = "zz_patchkit_autoload.start"

#: A ``.start`` file names an entry point, which ``site`` imports and calls at every start. It is a
#: top-level module of its own, not one in ``patchkit``: importing ``patchkit`` costs tens of ms.
START_MODULE = "_patchkit_autoload"
START_LINE = "_patchkit_autoload:run\n"
START_SOURCE = '''"""patchkit's start-up hook for Python 3.15+ (PEP 829), named by zz_patchkit_autoload.start."""

import os


def run() -> None:
    """Autoload patchkit when PATCHKIT_AUTOLOAD is set; otherwise import nothing."""
    if "PATCHKIT_AUTOLOAD" in os.environ:
        from patchkit.processes.autoload import run_at_startup

        run_at_startup()
'''


class build_py_with_hook(build_py):
    def run(self) -> None:
        super().run()
        self.mkpath(self._hook_dir())
        for name, text in self._hook_files().items():
            with open(os.path.join(self._hook_dir(), name), "w", encoding="utf-8") as handle:
                handle.write(text)

    @staticmethod
    def _hook_files() -> dict[str, str]:
        return {HOOK_NAME: HOOK_LINE, START_NAME: START_LINE, f"{START_MODULE}.py": START_SOURCE}

    def _hook_dir(self) -> str:
        if getattr(self, "editable_mode", False):
            return self.get_finalized_command("install").install_lib
        return self.build_lib

    def get_outputs(self, *args, **kwargs) -> list[str]:
        outputs = list(super().get_outputs(*args, **kwargs))
        if not getattr(self, "editable_mode", False):
            outputs.extend(os.path.join(self._hook_dir(), name) for name in self._hook_files())
        return outputs


setup(cmdclass={"build_py": build_py_with_hook})
