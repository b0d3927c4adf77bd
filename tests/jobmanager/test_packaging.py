"""``absflow.zip`` and ``env.tar.gz`` without a cluster: which files the zip takes, that
its bytes depend only on the sources, and the env packing's errors (the ``package``
command around them is tested in ``test_submit``)."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from jobmanager import packaging
from runtime.errors import PackagingError


def source_tree(root: Path) -> Path:
    """The four packages with a module each, a sub-package, a cache, data and a stranger."""
    for package in packaging.PACKAGES:
        (root / package / "sub").mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"NAME = {package!r}\n")
        (root / package / "sub" / "mod.py").write_text("X = 1\n")
        (root / package / "__pycache__").mkdir()
        (root / package / "__pycache__" / "stale.py").write_text("raise SystemExit\n")
        (root / package / "notes.txt").write_text("not code\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("")
    return root


def test_package_env_outside_a_virtualenv_says_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    with pytest.raises(PackagingError, match="is not in one") as info:
        packaging.build_env(tmp_path, pack=lambda **_kw: "")
    assert "python -m venv env" in str(info.value)


def test_package_env_packs_the_virtualenv_and_wraps_venv_pack_errors(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def pack(**kw: Any) -> str:
        calls.append(kw)
        if kw["prefix"] == "/editable":
            raise RuntimeError("Cannot pack an environment with editable packages")
        return str(kw["output"])

    target = packaging.build_env(tmp_path, prefix="/venv", pack=pack)
    assert target == tmp_path / "env.tar.gz"
    assert calls == [{"prefix": "/venv", "output": str(target), "force": True}]
    with pytest.raises(PackagingError, match=r"editable packages.*not pip install -e"):
        packaging.build_env(tmp_path, prefix="/editable", pack=pack)


def test_the_zip_takes_the_four_packages_modules_only(tmp_path: Path) -> None:
    root = source_tree(tmp_path / "src")
    expected = sorted(f"{p}/{m}" for p in packaging.PACKAGES for m in ("__init__.py", "sub/mod.py"))
    assert [p.relative_to(root).as_posix() for p in packaging.module_files(root)] == expected
    target = packaging.build_zip(tmp_path / "out", root=root)
    assert target == tmp_path / "out" / "absflow.zip"
    with zipfile.ZipFile(target) as zf:
        assert zf.namelist() == expected
        assert zf.read("channels/__init__.py") == b"NAME = 'channels'\n"
        assert {i.external_attr >> 16 for i in zf.infolist()} == {0o644}
    assert os.listdir(tmp_path / "out") == ["absflow.zip"]  # no temporary file left


def test_the_zips_bytes_depend_on_the_sources_only(tmp_path: Path) -> None:
    root = source_tree(tmp_path / "src")
    first = packaging.build_zip(tmp_path / "a", root=root).read_bytes()
    for path in packaging.module_files(root):
        os.utime(path, (1_700_000_000, 1_700_000_000))
    assert packaging.build_zip(tmp_path / "b", root=root).read_bytes() == first
    (root / "runtime" / "sub" / "mod.py").write_text("X = 2\n")
    rebuilt = packaging.build_zip(tmp_path / "a", root=root)  # replaces the older zip
    assert rebuilt.read_bytes() != first
    assert zipfile.ZipFile(rebuilt).read("runtime/sub/mod.py") == b"X = 2\n"


def test_the_source_root_is_where_the_packages_were_imported_from() -> None:
    root = packaging.source_root()
    assert all((root / p / "__init__.py").is_file() for p in packaging.PACKAGES)
    assert Path(packaging.__file__).resolve() == root / "jobmanager" / "packaging.py"


def test_build_env_without_venv_pack_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "venv_pack", None)  # import venv_pack -> ImportError
    with pytest.raises(PackagingError, match=r"needs venv-pack.*absflow\[cluster\]"):
        packaging.build_env(tmp_path, prefix="/venv")
    assert not (tmp_path / "env.tar.gz").exists()


def test_the_current_venv_is_this_interpreters_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "prefix", "/somewhere/env")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert packaging.current_venv() == "/somewhere/env"
