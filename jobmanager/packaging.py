"""What a cluster needs of absflow: ``absflow.zip`` (the four packages, for
``spark-submit --py-files``) and, optionally, ``env.tar.gz``: the virtualenv the driver
runs in, packed with venv-pack, for ``--archives env.tar.gz#env`` where the executors'
Python lacks absflow's dependencies (YARN, usually).

The zip is deterministic: the same sources give the same bytes (sorted entries, fixed
timestamps), so a rebuilt zip does not look like new code to anyone comparing them.
"""

from __future__ import annotations

import os
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from runtime.errors import PackagingError

PACKAGES = ("runtime", "channels", "statebackend", "jobmanager")
ZIP_NAME = "absflow.zip"
ENV_NAME = "env.tar.gz"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
INSTALL_CLUSTER = "pip install 'absflow[cluster]'"


def source_root() -> Path:
    """The directory holding the four packages this interpreter imported them from."""
    root = Path(__file__).resolve().parent.parent
    missing = [p for p in PACKAGES if not (root / p / "__init__.py").is_file()]
    if missing:
        raise PackagingError(
            f"cannot package absflow from {root}: {', '.join(missing)} not found there as "
            "directories (is absflow imported from a zip?). Run python -m jobmanager package "
            "with a Python where absflow is installed (pip install .) or from a checkout."
        )
    return root


def module_files(root: Path) -> list[Path]:
    """Every ``.py`` file of the four packages under ``root``, sorted (no caches)."""
    return sorted(
        path
        for package in PACKAGES
        for path in (root / package).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def build_zip(out_dir: Path, root: Path | None = None) -> Path:
    """Write ``out_dir/absflow.zip`` (replacing an older one atomically); returns its path."""
    root = root or source_root()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ZIP_NAME
    tmp = out_dir / f".{ZIP_NAME}.{os.getpid()}.tmp"
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in module_files(root):
                entry = zipfile.ZipInfo(path.relative_to(root).as_posix(), _EPOCH)
                entry.compress_type = zipfile.ZIP_DEFLATED
                entry.external_attr = 0o644 << 16
                zf.writestr(entry, path.read_bytes())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def current_venv() -> str:
    """The virtualenv this interpreter runs in; PackagingError when it is not one."""
    if sys.prefix == sys.base_prefix:
        raise PackagingError(
            f"--env packs the virtualenv the driver runs in, but {sys.executable} is not in "
            f"one (sys.prefix {sys.prefix} is the base installation). Create one and install "
            f"absflow there: python -m venv env && env/bin/{INSTALL_CLUSTER}, then run "
            "env/bin/python -m jobmanager package --env."
        )
    return sys.prefix


def _venv_pack() -> Callable[..., str]:
    try:
        import venv_pack
    except ImportError as err:
        raise PackagingError(
            f"--env needs venv-pack to pack the virtualenv: {INSTALL_CLUSTER} "
            "(or pip install venv-pack)"
        ) from err
    pack: Callable[..., str] = venv_pack.pack
    return pack


def build_env(
    out_dir: Path, prefix: str | None = None, pack: Callable[..., str] | None = None
) -> Path:
    """Pack the virtualenv ``prefix`` (default: this interpreter's) into
    ``out_dir/env.tar.gz`` with venv-pack; returns its path.

    The archive's ``bin/python`` links to the base interpreter by its absolute path:
    every node needs that Python at the same path (venv-pack's own limitation).
    """
    pack = pack or _venv_pack()
    prefix = prefix or current_venv()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ENV_NAME
    try:
        pack(prefix=prefix, output=str(target), force=True)
    except Exception as err:  # venv_pack.VenvPackException: editable installs, not a venv
        raise PackagingError(
            f"venv-pack could not pack {prefix}: {err}. Pack a virtualenv with absflow's "
            f"dependencies installed normally ({INSTALL_CLUSTER}, not pip install -e)."
        ) from err
    return target
