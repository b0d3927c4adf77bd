"""A superstep heavy in messages (test_iteration_streams): its step lives in a module of
its own, so a task process that unpickles it imports nothing else (its RSS is measured)."""

from __future__ import annotations

from typing import Any

from runtime.iterations import Step

FAN_KEYS, FAN, PAYLOAD = 3000, 16, 8000
BLOBS = [bytes([i]) * PAYLOAD for i in range(251)]


def max_blob(a: bytes, b: bytes) -> bytes:
    return a if a >= b else b


class FanOutStep(Step):
    """Every key sends an 8 kB message to 16 keys: one superstep is ~384 MB of messages
    before combining. Without a combiner the inbox holds them all (the companion)."""

    name = "fan_out"

    def messages(self, key: Any, value: int, side: Any) -> list[tuple[int, bytes]]:
        blob = BLOBS[key % 251]
        return [((key + j * (FAN_KEYS // FAN) + 1) % FAN_KEYS, blob) for j in range(FAN)]

    def update(self, key: Any, value: int, inbox: Any, side: Any, total: float) -> int:
        best = inbox if isinstance(inbox, bytes) else max(inbox)
        return value + best[0]


class CombinedFanOutStep(FanOutStep):
    combine = staticmethod(max_blob)


def fan_out_expected() -> dict[int, int]:
    senders: dict[int, list[int]] = {k: [] for k in range(FAN_KEYS)}
    for key in range(FAN_KEYS):
        for j in range(FAN):
            senders[(key + j * (FAN_KEYS // FAN) + 1) % FAN_KEYS].append(key % 251)
    return {k: max(s) for k, s in senders.items()}
