"""``SourceTree.module_file`` finds modules of an sdist that keeps its packages under ``src/`` (Megatron-Bridge)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from patchkit.matrix.artifacts import SourceTree, _unpack_python


def _sdist(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tarred:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"megatron_bridge-0.4.2/{name}")
            info.size = len(data)
            tarred.addfile(info, io.BytesIO(data))
    return path


def test_src_layout_sdist_modules_are_found(tmp_path):
    archive = _sdist(tmp_path / "megatron_bridge-0.4.2.tar.gz", {
        "setup.py": "",
        "src/megatron/bridge/__init__.py": "",
        "src/megatron/bridge/models/gpt_provider.py": "class GPTModelProvider: ...\n",
    })
    root = tmp_path / "tree"
    _unpack_python(archive, root)
    tree = SourceTree("megatron-bridge", "0.4.2", root, archive.name)
    found = tree.module_file("megatron.bridge.models.gpt_provider")
    assert found == root / "src/megatron/bridge/models/gpt_provider.py"
    assert tree.module_file("megatron.bridge") == root / "src/megatron/bridge/__init__.py"
    assert tree.module_file("megatron.bridge.absent") is None


def test_flat_layout_wins_over_src(tmp_path):
    for base in (tmp_path, tmp_path / "src"):
        (base / "pkg").mkdir(parents=True)
        (base / "pkg" / "mod.py").write_text("")
    assert SourceTree("pkg", "1", tmp_path, "x").module_file("pkg.mod") == tmp_path / "pkg" / "mod.py"
