"""The evaluation page's conclusions follow the rules (benchmarks/eval_report.py over
benchmarks/verdicts.py): a synthetic evaluation whose intervals straddle, clear or miss
the targets, and its result-file form read back unchanged."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from eval_data import Config, Evaluation, Run, Setting, Study
from eval_report import Report


def runs(times: list[float], checkpoints: int = 0, duration_ms: float = 100.0) -> list[Run]:
    return [
        Run(t, [{"duration_ms": duration_ms}] * checkpoints, 0, {0.5: 10.0, 0.99: 20.0})
        for t in times
    ]


def evaluation(abs_ratios: list[float], sync_ratios: list[float]) -> Evaluation:
    """Six rounds at p = 2: no checkpoints take 10 s every round."""
    setting = Setting(
        seconds=10.0,
        repeat=len(abs_ratios),
        parallelism=2,
        intervals=[0.1],
        other_modes=[],
        throttle=0.5,
        throttled=[Config(None)],
        parallelisms=[2],
        backpressure_modes=[],
        launcher="local",
    )
    none = [10.0] * len(abs_ratios)
    full = Study(
        n=1000,
        runs={
            "none": runs(none),
            "exactly_once@0.1": runs([10 * r for r in abs_ratios], 90, 120.0),
            "synchronous@0.1": runs([10 * r for r in sync_ratios], 90),
            "exactly_once@3.0": runs(none, 3),
        },
    )
    throttled = Study(n=500, rate=50.0, runs={"none": runs(none)})
    return Evaluation(setting, 100.0, full, throttled, {2: full}, Study(n=0), {}, 60.0)


def first_verdict(ev: Evaluation) -> str:
    verdicts: list[str] = Report(ev, stamp="stamp", cores=2).verdicts()
    return verdicts[0]


def test_an_overhead_whose_interval_straddles_the_target_is_unresolved() -> None:
    # issue 41's case: median +8.5 %, the rounds from +0.5 to +12.6 %
    ev = evaluation([1.005, 1.07, 1.08, 1.09, 1.10, 1.126], [1.5] * 6)
    line = first_verdict(ev)
    assert "+8.5 %" in line and "95 % CI of the median, 6 rounds" in line
    assert "**unresolved**" in line


def test_an_overhead_is_within_or_above_only_over_the_whole_interval() -> None:
    assert "**within**" in first_verdict(evaluation([1.01, 1.02, 1.03] * 2, [1.5] * 6))
    assert "**above**" in first_verdict(evaluation([1.051, 1.06, 1.07] * 2, [1.5] * 6))


def test_with_five_rounds_the_claim_rests_on_the_iqr_labelled_as_such() -> None:
    line = first_verdict(evaluation([1.01, 1.02, 1.03, 1.04, 1.045], [1.5] * 5))
    assert "IQR, 5 rounds" in line and "CI" not in line


def test_fig6_holds_only_when_both_halves_are_resolved_its_way() -> None:
    def claim(abs_r: list[float], sync_r: list[float]) -> str:
        verdicts: list[str] = Report(evaluation(abs_r, sync_r), "stamp", 2).verdicts()
        [line] = [v for v in verdicts if v.startswith("**Fig. 6")]
        return line

    assert "holds here" in claim([1.01, 1.02, 1.03] * 2, [1.5] * 6)
    # synchronous not resolved as costlier: its gap straddles 0
    assert "unresolved here" in claim([1.01, 1.02, 1.03] * 2, [0.99, 1.0, 1.1] * 2)
    assert "does not hold here" in claim([1.1, 1.2, 1.3] * 2, [1.5] * 6)


def test_the_page_prints_drain_beside_halted_and_fig7_as_fixed_data_at_3_s() -> None:
    page = Report(evaluation([1.02] * 6, [1.5] * 6), "stamp", 2).markdown()
    assert "| sources halted, % of run | drain ms p50 / p99 |" in page
    assert "Fixed-data (strong) scaling" in page and "ABS every 3 s" in page
    assert "weak scaling" not in page


def test_an_evaluation_reads_back_from_its_result_form_unchanged() -> None:
    ev = evaluation([1.01, 1.02, 1.03] * 2, [1.5] * 6)
    doc = ev.to_json()
    assert Evaluation.from_json(doc).to_json() == doc
