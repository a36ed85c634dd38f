"""Ships patchkit's start-up hook, a ``.pth`` file, at the root of site-packages.

Everything else about the package is declared in pyproject.toml; this file exists only because
setuptools has no declarative way to put a file outside a package. ``build_py`` writes the hook
next to the packages in ``build_lib`` (so ``pip install .`` and wheels carry it); for an editable
install (PEP 660) setuptools keeps only what its own editable strategy generates from ``build_lib``,
so the hook is written straight into the editable wheel's root, which ``editable_wheel`` exposes as
the ``install`` command's ``install_lib``.
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


class build_py_with_hook(build_py):
    def run(self) -> None:
        super().run()
        self.mkpath(self._hook_dir())
        with open(self._hook_path(), "w", encoding="utf-8") as handle:
            handle.write(HOOK_LINE)

    def _hook_dir(self) -> str:
        if getattr(self, "editable_mode", False):
            return self.get_finalized_command("install").install_lib
        return self.build_lib

    def _hook_path(self) -> str:
        return os.path.join(self._hook_dir(), HOOK_NAME)

    def get_outputs(self, *args, **kwargs) -> list[str]:
        outputs = list(super().get_outputs(*args, **kwargs))
        if not getattr(self, "editable_mode", False):
            outputs.append(self._hook_path())
        return outputs


setup(cmdclass={"build_py": build_py_with_hook})
