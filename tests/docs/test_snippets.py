"""Every runnable code block of the README and the docs runs (tests/docs/snippets.py says
what runnable means), each as a test of its own, on the local launcher: a snippet that
drifts from the API fails here."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.docs.snippets import ROOT, Snippet, all_snippets, snippets_in

SNIPPETS = all_snippets()


def run_snippet(snippet: Snippet, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "snippet.py"
    script.write_text(snippet.code)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("ABSFLOW_LAUNCHER", "local")
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.harness
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_runnable_block_runs(snippet: Snippet, tmp_path: pathlib.Path) -> None:
    done = run_snippet(snippet, tmp_path)
    assert done.returncode == 0, (
        f"the runnable block at {snippet.id} failed (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


def test_the_readme_tour_is_runnable() -> None:
    readme = [s for s in SNIPPETS if s.path == "README.md"]
    assert readme, "the README's tour must be marked <!-- runnable -->"
    assert "Dataflow(" in readme[0].code


def test_a_broken_snippet_fails(tmp_path: pathlib.Path) -> None:
    """The runner can fail: a block using an API that does not exist exits non-zero."""
    text = "<!-- runnable -->\n```python\nfrom runtime import Dataflow\nDataflow('x').nope()\n```\n"
    (snippet,) = snippets_in(text, "example.md")
    done = run_snippet(snippet, tmp_path)
    assert done.returncode != 0
    assert "AttributeError" in done.stderr


def test_markers_are_parsed_strictly() -> None:
    found = snippets_in(
        "text\n<!-- runnable -->\n````python\nprint(1)\n```\nprint(2)\n````\n```python\nx\n```\n",
        "a.md",
    )
    assert [(s.line, s.code) for s in found] == [(3, "print(1)\n```\nprint(2)\n")]
    quoted = "````markdown\n<!-- runnable -->\n```python\nprint(3)\n```\n````\n"
    assert snippets_in(quoted, "a.md") == []  # the marker shown as an example
    with pytest.raises(ValueError, match=r"a\.md:1"):
        snippets_in("<!-- runnable -->\n\n```python\nprint(1)\n```\n", "a.md")
    with pytest.raises(ValueError, match="never closes"):
        snippets_in("<!-- runnable -->\n```python\nprint(1)\n", "a.md")
