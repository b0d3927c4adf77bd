"""A loop head's back-edge log at another parallelism (`runtime.snapshot_modes`): the
records the old heads logged are routed again by the feedback's key, each to one head."""

from __future__ import annotations

from channels.messages import decode_header, decode_records, encode_data
from channels.partitioners import HashPartitioner
from runtime.snapshot_modes import BackEdgeRouting, back_edge_routing, redistributable_logs
from tests.integration.loops import collatz, multiplying


def first(record: tuple[int, int]) -> int:
    return record[0]


def test_each_logged_record_goes_to_exactly_the_head_its_key_belongs_to_now() -> None:
    old_logs = [  # two old heads' logs, each two frames, on old channels 7 and 9
        [encode_data(7, [(k, k * 10) for k in range(0, 50)]), encode_data(7, [(3, 1), (3, 2)])],
        [encode_data(9, [(k, -k) for k in range(50, 120)])],
    ]
    routed: dict[int, list[tuple[int, int]]] = {}
    for subtask in range(3):
        routing = BackEdgeRouting(HashPartitioner(first, 3, 128), channel=40 + subtask)
        frames = [f for log in old_logs for f in routing.mine(log, subtask)]
        assert all(decode_header(f)[0] == 40 + subtask for f in frames)  # its own channel
        routed[subtask] = [tuple(r) for f in frames for r in decode_records(f)]
    every = [tuple(r) for log in old_logs for f in log for r in decode_records(f)]
    assert sorted(r for rs in routed.values() for r in rs) == sorted(every)  # each once
    owner = HashPartitioner(first, 3, 128)
    for subtask, records in routed.items():
        assert all(owner.target_for_key(k) == subtask for k, _ in records)
    assert [v for k, v in routed[owner.target_for_key(3)] if k == 3] == [30, 1, 2]  # in order


def test_a_head_that_owns_none_of_a_frame_replays_nothing_of_it() -> None:
    owner = HashPartitioner(first, 2, 128)
    key = next(k for k in range(100) if owner.target_for_key(k) == 0)
    routing = BackEdgeRouting(HashPartitioner(first, 2, 128), channel=1)
    assert routing.mine([encode_data(5, [(key, 1)])], 1) == []


def test_routing_is_offered_only_for_one_keyed_feedback() -> None:
    keyed, round_robin = collatz(10).plan(), multiplying(10).plan()
    heads = [t for t in keyed.tasks if t.back_edge_inputs]
    assert heads and all(back_edge_routing(t, keyed) is not None for t in heads)
    assert all(back_edge_routing(t, keyed) is None for t in keyed.tasks if not t.back_edge_inputs)
    assert all(back_edge_routing(t, round_robin) is None for t in round_robin.tasks)
    assert redistributable_logs(keyed) == {"loop#backedge-log"}
    assert redistributable_logs(round_robin) == frozenset()
