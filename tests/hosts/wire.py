"""A slow, lossy wire between a host's veth and the hosts' bridge, in user space: netem's
``delay D loss P`` for kernels built without sch_netem.

    python tests/hosts/wire.py VETH TAP DELAY_MS LOSS_PERCENT SEED

The veth (the bridge-side end of a host's link, taken off the bridge by the caller) is
read and written through a packet socket; a TAP device named TAP, made here, is the
other end (the caller puts it on the bridge). Every frame crossing in either direction
is dropped with probability LOSS_PERCENT / 100, else sent on DELAY_MS after it arrived,
in arrival order. Both ends carry virtio-net headers, so segmentation and checksum
offloads (a 64 KiB TCP segment, a checksum left to the device) cross the wire as they
would cross a bridge. Prints ``ready`` once both ends are open; ends on SIGTERM, and the
TAP device ends with it.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
SOL_PACKET, PACKET_VNET_HDR, PACKET_IGNORE_OUTGOING = 263, 15, 23
PACKET_OUTGOING = 4
ETH_P_ALL = 0x0003
FRAME = 65_536 + 64  # a GSO frame and its virtio-net header


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(
        fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
    )
    return fd


def open_veth(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    with contextlib.suppress(OSError):  # Linux >= 4.20; the pkttype check does it elsewhere
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.bind((name, 0))
    sock.setblocking(False)
    return sock


class Direction:
    """Frames of one direction, each due ``delay`` seconds after it arrived."""

    def __init__(self, delay: float, loss: float, rng: random.Random) -> None:
        self.delay, self.loss, self.rng = delay, loss, rng
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.passed = self.dropped = 0

    def arrived(self, frame: bytes, now: float) -> None:
        if self.rng.random() < self.loss:
            self.dropped += 1
        else:
            self.queue.append((now + self.delay, frame))

    def due(self, now: float) -> list[bytes]:
        out = []
        while self.queue and self.queue[0][0] <= now:
            out.append(self.queue.popleft()[1])
        self.passed += len(out)
        return out

    def next_due(self) -> float | None:
        return self.queue[0][0] if self.queue else None


def relay(veth: socket.socket, tap: int, delay: float, loss: float, seed: int) -> None:
    rng = random.Random(seed)
    to_tap, to_veth = Direction(delay, loss, rng), Direction(delay, loss, rng)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print("ready", flush=True)
    while not stopping:
        now = time.monotonic()
        for frame in to_tap.due(now):
            _send(lambda f: os.write(tap, f), frame)
        for frame in to_veth.due(now):
            _send(veth.send, frame)
        dues = [d for d in (to_tap.next_due(), to_veth.next_due()) if d is not None]
        timeout = max(0.0, min(dues) - time.monotonic()) if dues else 0.5
        try:
            readable, _, _ = select.select([veth.fileno(), tap], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        if veth.fileno() in readable:
            while True:
                try:
                    frame, address = veth.recvfrom(FRAME)
                except BlockingIOError:
                    break
                if address[2] != PACKET_OUTGOING:  # not a frame this wire sent
                    to_tap.arrived(frame, now)
        if tap in readable:
            while True:
                try:
                    frame = os.read(tap, FRAME)
                except BlockingIOError:
                    break
                to_veth.arrived(frame, now)
    print(
        f"passed {to_tap.passed + to_veth.passed}, dropped {to_tap.dropped + to_veth.dropped}",
        flush=True,
    )


def _send(write: Callable[[bytes], object], frame: bytes) -> None:
    # a full device queue or a link going down: the frame is lost, as on a wire
    with contextlib.suppress(OSError):
        write(frame)


def main() -> int:
    veth_name, tap_name, delay_ms, loss_percent, seed = sys.argv[1:]
    tap = open_tap(tap_name)
    veth = open_veth(veth_name)
    relay(veth, tap, float(delay_ms) / 1000, float(loss_percent) / 100, int(seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
