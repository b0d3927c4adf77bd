"""The user API is generic in its record and key types (``Stream[T]``, ``KeyedStream[T, K]``):
mypy infers what flows from the source through every step and refuses a function that
does not fit. The pipeline of ``typed_wordcount`` is checked by the suite's mypy run
(``python -m mypy`` covers ``tests``); the snippets below are checked by mypy here, so a
test fails if the types stop catching a wrong-typed function."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from runtime import Dataflow
from runtime.api.dataflow import KeyedStream, Stream
from runtime.api.testing import ListSink, TestingSource, run_local

mypy_api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")


def typed_wordcount(
    lines: list[str], out: list[tuple[str, int]]
) -> tuple[Dataflow, Stream[tuple[str, int]]]:
    flow = Dataflow("typed_wordcount", parallelism=2)
    text: Stream[str] = flow.source(TestingSource(lines), name="lines")
    words: Stream[str] = text.flat_map(str.split, name="words")
    pairs: Stream[tuple[str, int]] = words.map(lambda w: (w, 1), name="pairs")
    keyed: KeyedStream[tuple[str, int], str] = pairs.key_by(lambda p: p[0], name="word")
    counts: Stream[tuple[str, int]] = keyed.reduce(lambda a, b: (a[0], a[1] + b[1]))
    counts.sink(ListSink(out), name="counts")
    return flow, counts


@pytest.mark.harness
def test_the_typed_pipeline_runs() -> None:
    out: list[tuple[str, int]] = []
    flow, _ = typed_wordcount(["a b a", "b a"], out)
    run_local(flow)
    final: dict[str, int] = {}
    for word, n in out:
        final[word] = max(final.get(word, 0), n)
    assert final == {"a": 3, "b": 2}


def mypy_errors(body: str, tmp_path: Path) -> list[str]:
    """mypy's error lines (the project's settings: strict) for ``body`` appended to a
    snippet that builds ``numbers``, a stream of ints. The project's mypy cache keeps it
    to seconds once the suite's mypy run (or a first snippet) checked the packages."""
    config = tmp_path / "mypy.ini"
    config.write_text(
        "[mypy]\npython_version = 3.11\nstrict = True\nignore_missing_imports = True\n"
        f"cache_dir = {ROOT / '.mypy_cache'}\n"
    )
    source = SNIPPET_HEAD + textwrap.dedent(body)
    stdout, stderr, _ = mypy_api.run(
        ["--config-file", str(config), "--follow-imports=silent", "-c", source]
    )
    assert not stderr, stderr
    return [line for line in stdout.splitlines() if ": error:" in line]


ROOT = Path(__file__).resolve().parents[3]
SNIPPET_HEAD = textwrap.dedent(
    """
    from runtime import Dataflow
    from runtime.sources import CollectionSource
    from runtime.window_kinds import Tumbling

    flow = Dataflow("snippet")
    numbers = flow.source(CollectionSource([1, 2, 3]))
    """
)


def test_mypy_accepts_functions_that_fit(tmp_path: Path) -> None:
    fits = """
        words = numbers.map(lambda n: str(n))
        lengths = words.map(len).key_by(lambda n: n % 2).reduce(lambda a, b: a + b)
        sums = words.key_by(lambda w: w[0]).aggregate(0, lambda acc, w: acc + len(w))
        per_window = words.key_by(len).window(Tumbling(10)).count().map(lambda r: r[3] + 1)
        """
    assert mypy_errors(fits, tmp_path) == []


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("numbers.map(lambda n: n.upper())", '"int" has no attribute "upper"'),
        (
            "numbers.map(str).filter(lambda s: s + 1 > 2)",
            'Unsupported operand types for + ("str" and "int")',
        ),
        (
            "numbers.key_by(lambda n: n).reduce(lambda a, b: str(a))",
            'Incompatible return value type (got "str", expected "int")',
        ),
        (
            "k = numbers.key_by(str)\nk.connect(numbers.key_by(lambda n: n))",
            'Incompatible return value type (got "int", expected "str")',  # keys must match
        ),
    ],
    ids=["map", "filter", "reduce", "connect-keys"],
)
def test_mypy_refuses_a_function_that_does_not_fit(line: str, error: str, tmp_path: Path) -> None:
    """The companion of the typed pipeline: with the streams untyped (``Any``), each
    of these lines would pass mypy and fail in a task at run time."""
    errors = mypy_errors(line, tmp_path)
    assert errors and any(error in e for e in errors), errors


def test_an_untyped_stream_lets_the_wrong_function_through(tmp_path: Path) -> None:
    """What the refusals above rest on: the same wrong lambda on a stream whose record
    type is unknown (``Stream[Any]``, as every stream was before) passes mypy."""
    line = "from typing import Any\nfrom runtime.api.dataflow import Stream\n"
    line += "untyped: Stream[Any] = numbers\nuntyped.map(lambda n: n.upper())"
    assert mypy_errors(line, tmp_path) == []
