"""The examples' fault flags: bad values are usage errors (exit 2) naming what is accepted."""

from __future__ import annotations

import argparse

import pytest

from jobmanager import faultargs
from jobmanager.faults import Kill, RandomKills
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
    faultargs.add_arguments(parser)
    return faultargs.faults_from(parser, parser.parse_args(argv), plan())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2s", faultargs.When(seconds=2.0)),
        ("1.5", faultargs.When(seconds=1.5)),
        ("500ms", faultargs.When(seconds=0.5)),
        ("chk3", faultargs.When(checkpoint=3)),
        ("alignment", faultargs.When(during="alignment")),
        ("snapshot", faultargs.When(during="snapshot")),
    ],
)
def test_moments(text: str, expected: faultargs.When) -> None:
    assert faultargs.parse_when(text) == expected


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
