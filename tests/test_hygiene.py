"""The house rules, checked on every run: one formatting hand, lint (cyclomatic
complexity at most 15 included), strict types over the packages and the tests, and
no module grown past ~450 lines. The tools and their settings live in pyproject.toml."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "channels", "statebackend", "jobmanager")
# Everything of ours that is Python; a virtualenv created inside the clone is not ours.
SOURCES = (*PACKAGES, "tests", "examples", "benchmarks")
MAX_MODULE_LINES = 450


def run_tool(tool: str, *args: str) -> None:
    """``python -m tool args`` with this interpreter (the env the tests run in)."""
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed: pip install -e '.[test]'")
    argv = [sys.executable, "-m", tool, *args]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{tool} {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


def test_ruff_lint() -> None:
    run_tool("ruff", "check", *SOURCES)


def test_ruff_format() -> None:
    run_tool("ruff", "format", "--check", *SOURCES)


def test_mypy_strict() -> None:
    run_tool("mypy")


def test_no_module_over_the_size_limit() -> None:
    big = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not big, f"split these modules (over {MAX_MODULE_LINES} lines): {big}"
