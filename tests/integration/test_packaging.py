"""absflow.zip is all a cluster needs of absflow: built by ``python -m jobmanager package``,
it runs a checkpointed job under spark-submit in an interpreter that cannot import absflow
any other way, on the driver and in the tasks."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.integration.standalone import result_fields

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent.parent
JOB = str(ROOT / "tests" / "integration" / "standalone_job.py")


def clean_venv(target: Path) -> Path:
    """A venv that sees this interpreter's third-party packages (pyspark, pyzmq, ...) but
    not absflow: a .pth lists the real site-packages as plain paths, so their own .pth
    files (the editable install's finder among them) are never run."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    python = target / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    real = dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]])
    Path(purelib, "absflow-deps.pth").write_text("\n".join(real) + "\n")
    return python


def test_the_zip_runs_a_job_where_nothing_else_provides_absflow(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "jobmanager", "package", "--out", str(tmp_path / "dist")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    zipped = tmp_path / "dist" / "absflow.zip"
    assert built.stdout == f"built {zipped}\n"

    python = clean_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    without = subprocess.run(
        [python, "-c", "import pyspark, zmq, msgpack, lz4, cloudpickle; import runtime"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "No module named 'runtime'" in without.stderr, without.stderr

    import pyspark

    spark_submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    done = subprocess.run(
        [
            *(spark_submit, "--master", "local[4]", "--conf", "spark.ui.enabled=false"),
            *("--py-files", str(zipped), JOB, "count", str(tmp_path / "chk"), "4000", "1e6"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    fields = result_fields(done.stdout)
    assert fields["records"] == fields["distinct"] == fields["total"] == "4000"
    inside = "absflow.zip/runtime/__init__.py"
    assert fields["driver_from"] == str(tmp_path / "dist" / inside)
    tasks = fields["tasks_from"].split(",")
    assert tasks and all(f.endswith(inside) for f in tasks), fields
