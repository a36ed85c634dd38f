"""The runtime's metadata reader gives importlib.metadata's answer in every layout it handles."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from patchkit.runtime import distinfo


def _site(tmp_path: Path, name: str) -> Path:
    site = tmp_path / name
    site.mkdir()
    return site


def _same(name: str) -> None:
    try:
        expected = metadata.version(name)
    except metadata.PackageNotFoundError:
        expected = None
    assert distinfo.version(name, fallback=lambda _: pytest.fail("fell back")) == expected


def test_dist_info_egg_info_folder_and_file_and_name_normalisation(tmp_path, monkeypatch) -> None:
    site = _site(tmp_path, "site")
    (site / "Foo.Bar_baz-1.2.3.dist-info").mkdir()
    (site / "Foo.Bar_baz-1.2.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: Foo.Bar_baz\nSummary: Version: 9 is not it\nVersion: 1.2.3\n\nVersion: 7\n")
    (site / "legacy_pkg-0.4.egg-info").mkdir()
    (site / "legacy_pkg-0.4.egg-info" / "PKG-INFO").write_text(
        "Metadata-Version: 1.0\nName: legacy-pkg\nversion: 0.4\n")
    (site / "single_file-2.0rc1.egg-info").write_text("Metadata-Version: 1.1\nName: single-file\nVersion: 2.0rc1\n")
    (site / "noversion-1.dist-info").mkdir()
    (site / "noversion-1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: noversion\n")
    monkeypatch.syspath_prepend(str(site))
    for name in ("foo-bar-baz", "Foo.Bar_baz", "FOO__bar.baz", "legacy-pkg", "legacy_pkg", "single-file",
                 "absent-dist"):
        _same(name)
    assert distinfo.version("foo-bar-baz") == "1.2.3"


def test_the_first_copy_on_sys_path_wins_and_a_new_install_is_seen(tmp_path, monkeypatch) -> None:
    for folder, version in (("a", "1.0"), ("b", "2.0")):
        info = _site(tmp_path, folder) / f"twice-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Name: twice\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    _same("twice")
    assert distinfo.version("twice") == "1.0"
    (tmp_path / "a" / "twice-1.0.dist-info" / "METADATA").unlink()
    (tmp_path / "a" / "twice-1.0.dist-info").rmdir()
    _same("twice")
    assert distinfo.version("twice") == "2.0"


def test_an_egg_on_sys_path_and_an_editable_source_checkout(tmp_path, monkeypatch) -> None:
    egg = tmp_path / "eggy-3.1-py3.12.egg"
    (egg / "EGG-INFO").mkdir(parents=True)
    (egg / "EGG-INFO" / "PKG-INFO").write_text("Name: eggy\nVersion: 3.1\n")
    checkout = _site(tmp_path, "checkout")  # `setup.py develop`: the source folder, its egg-info beside the code
    (checkout / "devpkg.egg-info").mkdir()
    (checkout / "devpkg.egg-info" / "PKG-INFO").write_text("Name: devpkg\nVersion: 0.0.1.dev0+g1234\n")
    monkeypatch.syspath_prepend(str(egg))
    monkeypatch.syspath_prepend(str(checkout))
    for name in ("eggy", "devpkg"):
        _same(name)


def test_every_installed_distribution_here_reads_the_same() -> None:
    names = {d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"]}
    assert names
    for name in sorted(names):
        _same(name)


def test_a_zip_on_sys_path_or_a_foreign_distribution_finder_falls_back(tmp_path, monkeypatch) -> None:
    import zipfile

    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("zipdist-5.0.dist-info/METADATA", "Name: zipdist\nVersion: 5.0\n")
    monkeypatch.syspath_prepend(str(archive))
    assert distinfo.version("zipdist") == metadata.version("zipdist") == "5.0"
    assert distinfo.version("zipdist", fallback=lambda name: "fallback") == "fallback"
    monkeypatch.syspath_prepend(str(tmp_path))

    class Finder:
        def find_spec(self, *args):
            return None

        def find_distributions(self, context=None):
            return iter(())

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    assert distinfo.version("anything", fallback=lambda name: "fallback") == "fallback"
