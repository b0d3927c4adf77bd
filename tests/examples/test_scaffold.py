"""The examples' scaffolding (examples/scaffold.py): bad fault flags are usage errors (exit 2)
naming what is accepted; the verdict decides the exit code from the check and, under
--chaos, the comparison with the failure-free run."""

from __future__ import annotations

import argparse

import pytest

from examples import scaffold
from jobmanager.faults import Kill, RandomKills
from jobmanager.result import JobResult
from runtime import Dataflow
from runtime.plan import JobPlan
from runtime.sources import CollectionSource


def plan() -> JobPlan:
    flow = Dataflow("job", parallelism=2)
    (
        flow.source(CollectionSource(["a b"]), name="lines")
        .flat_map(str.split, name="split")
        .key_by(lambda w: w)
        .aggregate(0, lambda n, _w: n + 1, name="count")
        .collect("counts")
    )
    return flow.plan()


def parse(argv: list[str]) -> list[object]:
    parser = argparse.ArgumentParser(prog="example")
    scaffold.add_arguments(parser)
    return scaffold.faults_from(parser, parser.parse_args(argv), plan())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2s", scaffold.When(seconds=2.0)),
        ("1.5", scaffold.When(seconds=1.5)),
        ("500ms", scaffold.When(seconds=0.5)),
        ("chk3", scaffold.When(checkpoint=3)),
        ("alignment", scaffold.When(during="alignment")),
        ("snapshot", scaffold.When(during="snapshot")),
    ],
)
def test_moments(text: str, expected: scaffold.When) -> None:
    assert scaffold.parse_when(text) == expected


def test_kills_from_flags() -> None:
    assert parse(["--kill-task", "count[1]", "--after", "chk3"]) == [
        Kill("count[1]", after_checkpoint=3)
    ]
    assert parse(["--kill-task", "split[0]"]) == [Kill("split[0]", after_seconds=1.0)]
    assert parse(["--chaos", "3", "--seed", "7"]) == [RandomKills(3, seed=7)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kill-task", "count[0]", "--after", "soon"], "'soon' is not a moment: use seconds"),
        (["--kill-task", "count[0]", "--after", "chk0"], "checkpoints are numbered from 1"),
        (["--kill-task", "cnt[0]"], "no step named 'cnt'"),
        (["--kill-task", "count[7]"], "subtasks are 0..1"),
        (["--kill-task", "count"], "must look like 'step[subtask]'"),
        (["--kill-task", "lines[0]", "--after", "alignment"], "alignment needs at least 2"),
        (["--after", "2s"], "--after needs --kill-task"),
        (["--chaos", "0"], "give at least 1 kill"),
        (["--chaos", "many"], "'many' is not a whole number"),
    ],
)
def test_bad_flags_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def result(out: list[int], unfired: list[str] | None = None) -> JobResult:
    return JobResult("job", {"out": out}, 1.0, 0, 0, None, unfired_faults=unfired or [])


def chaos(k: int | None) -> argparse.Namespace:
    return argparse.Namespace(chaos=k)


def sorted_out(r: JobResult) -> list[int]:
    return sorted(r.output("out"))


def test_the_verdict_is_the_check_without_chaos(capsys: pytest.CaptureFixture[str]) -> None:
    run = scaffold.ExampleRun(result([1, 2]), 1.0, None)
    assert scaffold.verdict(run, chaos(None), True) == 0
    assert scaffold.verdict(run, chaos(None), False) == 1
    assert capsys.readouterr().out == ""


def test_under_chaos_the_output_must_equal_the_failure_free_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    same = scaffold.ExampleRun(result([2, 1]), 1.0, result([1, 2]))
    assert scaffold.verdict(same, chaos(2), True, sorted_out) == 0
    assert "record for record: YES" in capsys.readouterr().out
    # the companion: a run that lost a record fails though its own check passed
    lost = scaffold.ExampleRun(result([1]), 1.0, result([1, 2]))
    assert scaffold.verdict(lost, chaos(2), True, sorted_out) == 1
    assert "record for record: NO" in capsys.readouterr().out


def test_under_chaos_without_a_reference_run_the_check_is_the_comparison(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = scaffold.ExampleRun(result([1], unfired=["kill count[0]"]), 1.0, None)
    assert scaffold.verdict(run, chaos(1), False) == 1
    out = capsys.readouterr().out
    assert "before a fault fired" in out and "failure-free result record for record: NO" in out
