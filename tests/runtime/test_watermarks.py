"""The input watermark (min over live channels, ended, idle, never backwards) and
watermark generation at a source (bounded out-of-orderness, splits, idleness)."""

from __future__ import annotations

import math

import pytest

from runtime.watermarks import END_OF_TIME, NO_WATERMARK, WatermarkGenerator, WatermarkValve


def test_valve_is_the_minimum_over_channels_and_never_goes_backwards() -> None:
    valve = WatermarkValve([0, 1, 2])
    steps = [
        # (channel, watermark, idle) -> the task's watermark after it (None: unchanged)
        ((0, 10, False), None),  # channels 1, 2 still at -inf
        ((1, 5, False), None),
        ((2, 7, False), 5),
        ((1, 20, False), 7),
        ((1, 3, False), None),  # a channel going backwards does not move anything
        ((2, 30, False), 10),
        ((0, 8, False), None),  # lower than its own last: ignored
    ]
    for (channel, wm, idle), expected in steps:
        assert valve.on_watermark(channel, wm, idle) == expected, (channel, wm)
    assert valve.current == 10


def test_an_ended_channel_no_longer_holds_the_watermark_back() -> None:
    valve = WatermarkValve([0, 1])
    assert valve.on_watermark(0, 100, False) is None
    assert valve.on_end_of_input(1) == 100  # channel 1 never sent a watermark
    assert valve.on_watermark(1, 500, False) is None  # after its end: no say
    assert valve.on_end_of_input(0) == END_OF_TIME


def test_an_idle_channel_stops_holding_back_and_holds_again_when_it_resumes() -> None:
    valve = WatermarkValve([0, 1])
    valve.on_watermark(0, 50, False)
    assert valve.on_watermark(1, 10, False) == 10
    assert valve.on_watermark(1, 10, True) == 50  # idle: only channel 0 counts
    assert not valve.all_idle
    assert valve.on_watermark(0, 60, False) == 60
    # resumes at 20: holds back again from now on, but the watermark never goes back
    assert valve.on_watermark(1, 20, False) is None
    assert valve.current == 60
    assert valve.on_watermark(0, 90, False) is None  # held by channel 1 at 20
    assert valve.on_watermark(1, 70, False) == 70


def test_every_channel_idle_holds_and_reports_idleness() -> None:
    valve = WatermarkValve([0, 1])
    valve.on_watermark(0, 5, False)
    valve.on_watermark(1, 6, False)
    assert valve.on_watermark(0, 5, True) == 6
    assert valve.on_watermark(1, 6, True) is None
    assert valve.all_idle


def test_the_restored_watermark_is_a_floor() -> None:
    valve = WatermarkValve([0])
    valve.restore(40)
    assert valve.on_watermark(0, 30, False) is None
    assert valve.current == 40
    assert valve.on_watermark(0, 41, False) == 41


def test_back_edge_channels_have_no_say() -> None:
    valve = WatermarkValve([0])  # channel 9 is a back-edge: not in the valve
    assert valve.on_watermark(9, 1000, False) is None
    assert valve.on_watermark(0, 3, False) == 3


def test_generator_bounded_out_of_orderness_never_backwards() -> None:
    gen = WatermarkGenerator(max_delay=5, idle_timeout=None)
    assert gen.watermark(0.0) is None  # nothing seen
    gen.observe(None, 100, 0.0)
    assert gen.watermark(0.0) == 95
    gen.observe(None, 90, 0.1)  # out of order: max stays 100
    assert gen.watermark(0.1) == 95
    gen.observe(None, 130, 0.2)
    assert gen.watermark(0.2) == 125


def test_generator_per_split_minimum_and_ended_splits() -> None:
    gen = WatermarkGenerator(max_delay=0, idle_timeout=None)
    gen.observe("p0", 100, 0.0)
    gen.observe("p1", 20, 0.0)
    assert gen.watermark(0.0) == 20  # the slow split holds it back
    gen.observe("p1", 50, 0.0)
    assert gen.watermark(0.0) == 50
    gen.end_split("p1")
    assert gen.watermark(0.0) == 100


def test_generator_idle_split_stops_holding_back_and_resumes() -> None:
    gen = WatermarkGenerator(max_delay=0, idle_timeout=1.0)
    gen.observe("p0", 100, 0.0)
    gen.observe("p1", 10, 0.0)
    assert gen.watermark(0.5) == 10
    gen.observe("p0", 200, 1.2)
    assert gen.watermark(1.2) == 200  # p1 idle for 1.2 s >= 1 s
    gen.observe("p1", 15, 1.3)  # p1 resumes: holds again (never backwards)
    assert gen.watermark(1.3) == 200
    gen.observe("p0", 300, 1.4)
    assert gen.watermark(1.4) == 200
    assert not gen.idle(1.4, 1.4)
    assert gen.idle(5.0, 5.0)  # both idle
    assert WatermarkGenerator(0, 1.0).idle(2.0, 2.0)  # nothing read for idle_timeout


def test_generator_snapshot_restore() -> None:
    gen = WatermarkGenerator(max_delay=1, idle_timeout=None)
    gen.observe(0, 10, 0.0)
    gen.observe(1, 7, 0.0)
    gen.watermark(0.0)
    fresh = WatermarkGenerator(max_delay=1, idle_timeout=None)
    fresh.restore(gen.snapshot(), 0.0)
    assert fresh.current == 6 and fresh.watermark(0.0) == 6


@pytest.mark.parametrize("value", [NO_WATERMARK, END_OF_TIME])
def test_sentinels_are_infinite(value: float) -> None:
    assert math.isinf(value)
