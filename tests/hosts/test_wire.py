"""The slow link of the host tests, measured from inside the hosts: 50 ms each way and 1 %
loss, whether netem or the user-space wire makes it, and none once the link is whole."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tests.hosts.netns import Hosts, netns_pids, unavailable
from tests.integration.standalone import wait_for

pytestmark = [pytest.mark.hosts]

# On host "b": a TCP server that accepts, reads to the end and counts the bytes.
SERVER = textwrap.dedent(
    """
    import socket, sys
    srv = socket.create_server((sys.argv[1], 7000))
    print("listening", flush=True)
    while True:
        conn, _ = srv.accept()
        n = 0
        while chunk := conn.recv(1 << 16):
            n += len(chunk)
        conn.sendall(str(n).encode())
        conn.close()
    """
)
# On host "a": connect times (one round trip each), then 4 MB through the link.
CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    rtts = []
    for _ in range(5):
        t = time.monotonic()
        s = socket.create_connection((sys.argv[1], 7000), timeout=30)
        rtts.append(time.monotonic() - t)
        s.close()
    s = socket.create_connection((sys.argv[1], 7000), timeout=60)
    s.sendall(b"x" * 4_000_000)
    s.shutdown(socket.SHUT_WR)
    got = int(s.recv(64))
    print(json.dumps({"rtt": sorted(rtts)[2], "bytes": got}))
    """
)


@pytest.fixture
def two_hosts() -> Iterator[Hosts]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    net = Hosts(["a", "b"])
    net.create()
    server = subprocess.Popen(
        [*net["b"].argv(sys.executable, "-c", SERVER, net["b"].ip)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        yield net
    finally:
        server.kill()
        server.wait()
        net.remove()
        wait_for(lambda: not net.leftovers(), 30.0, "the namespaces to be cleaned up")
        assert not any(netns_pids(h.ns) for h in net.hosts.values())


def measure(net: Hosts) -> dict[str, float]:
    client = [*net["a"].argv(sys.executable, "-c", CLIENT, net["b"].ip)]
    out = subprocess.run(client, capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def test_a_slow_link_delays_each_way_and_loses_frames_and_whole_again_does_not(
    two_hosts: Hosts,
) -> None:
    whole = measure(two_hosts)
    shaped = two_hosts.slow_link("b", slow=True)
    try:
        slow = measure(two_hosts)
    finally:
        counts = two_hosts.slow_link("b", slow=False)
    again = measure(two_hosts)
    print(
        f"{shaped}: rtt {slow['rtt'] * 1000:.0f} ms; whole {whole['rtt'] * 1000:.1f} ms; {counts}"
    )
    # a connect is one round trip: 50 ms out, 50 ms back; TCP resends what was lost
    assert slow["rtt"] >= 0.100 and slow["bytes"] == 4_000_000
    assert whole["rtt"] < 0.050 and again["rtt"] < 0.050 and again["bytes"] == 4_000_000
    if shaped.startswith("wire"):  # netem counts its drops in tc -s; the wire prints them
        passed, dropped = (int(w) for w in counts.replace(",", "").split()[1::2])
        assert passed > 1_000 and dropped >= passed // 200, counts
