"""Superstep alignment: when an iteration's loop head has all of superstep k's input.

A loop head of an iteration (``runtime.superstep``) sends superstep k's messages on the
feedback edge when the job manager says ``SuperstepGo(k)``, then the marker of k on every
feedback channel, behind them (FIFO). Its input of superstep k is complete when the
marker of k has come on **every** feedback channel into it, back-edges and the feedback
channels the back-edge search made regular alike (its own channel included, so never
before it sent its own). Like a barrier, but nothing is blocked: superstep k + 1 starts
only once every head reported k done, so no message of k + 1 can overtake a marker of k.

Markers of k may come before this head's own Go(k) (a peer heard it first): they are
counted then. The states follow ``BarrierHandlerState``: one state object whose event
methods return the next state; any event the protocol cannot produce raises
``BarrierProtocolError``.

Threading: task-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from channels.messages import SuperstepMarker
from runtime.barriers.protocol import BarrierProtocolError


@dataclass(frozen=True, slots=True)
class WaitingForGo:
    """The head has not started ``superstep`` (None: the first one of this attempt, any
    number); markers of it that came early are in ``arrived``, their sum in ``total``."""

    superstep: int | None
    arrived: frozenset[int] = frozenset()
    total: float = 0.0

    def go(self, superstep: int) -> Collecting:
        if self.superstep is not None and superstep != self.superstep:
            raise BarrierProtocolError(
                f"SuperstepGo({superstep}) while superstep {self.superstep} is next here"
            )
        return Collecting(superstep, self.arrived, self.total)

    def marker(self, channel: int, marker: SuperstepMarker) -> WaitingForGo:
        if self.superstep is not None and marker.superstep != self.superstep:
            raise BarrierProtocolError(
                f"the marker of superstep {marker.superstep} came on channel {channel} "
                f"while superstep {self.superstep} is next here"
            )
        if channel in self.arrived:
            raise BarrierProtocolError(
                f"a second marker of superstep {marker.superstep} on channel {channel}"
            )
        return WaitingForGo(
            marker.superstep, self.arrived | {channel}, self.total + marker.contribution
        )


@dataclass(frozen=True, slots=True)
class Collecting:
    """Superstep ``superstep`` started here; its markers came on ``arrived``."""

    superstep: int
    arrived: frozenset[int]
    total: float

    def go(self, superstep: int) -> Collecting:
        raise BarrierProtocolError(
            f"SuperstepGo({superstep}) while superstep {self.superstep} is still collected"
        )

    def marker(self, channel: int, marker: SuperstepMarker) -> Collecting:
        if marker.superstep != self.superstep:
            raise BarrierProtocolError(
                f"the marker of superstep {marker.superstep} came on channel {channel} "
                f"while superstep {self.superstep} is collected"
            )
        if channel in self.arrived:
            raise BarrierProtocolError(
                f"a second marker of superstep {marker.superstep} on channel {channel}"
            )
        return Collecting(
            self.superstep, self.arrived | {channel}, self.total + marker.contribution
        )


SuperstepState = WaitingForGo | Collecting


class SuperstepAligner:
    """Counts superstep markers over a head's feedback channels; calls
    ``aligned(superstep, total)`` once the head started a superstep and its marker came on
    every one of ``channels`` (``total``: the markers' contributions summed)."""

    def __init__(self, channels: Iterable[int], aligned: Callable[[int, float], None]) -> None:
        self.channels = frozenset(channels)
        if not self.channels:
            raise BarrierProtocolError("a superstep head needs at least one feedback channel")
        self._aligned = aligned
        self._state: SuperstepState = WaitingForGo(None)

    @property
    def state(self) -> SuperstepState:
        return self._state

    def go(self, superstep: int) -> None:
        """The head sent superstep ``superstep``'s messages and markers."""
        self._state = self._state.go(superstep)
        self._complete_if_aligned()

    def on_marker(self, channel: int, marker: SuperstepMarker) -> None:
        if channel not in self.channels:
            raise BarrierProtocolError(
                f"the marker of superstep {marker.superstep} came on channel {channel}, not a "
                f"feedback channel of this head ({sorted(self.channels)})"
            )
        self._state = self._state.marker(channel, marker)
        self._complete_if_aligned()

    def _complete_if_aligned(self) -> None:
        state = self._state
        if isinstance(state, Collecting) and state.arrived == self.channels:
            self._state = WaitingForGo(state.superstep + 1)
            self._aligned(state.superstep, state.total)

    def __repr__(self) -> str:
        return f"SuperstepAligner(state={self._state!r}, channels={sorted(self.channels)})"
