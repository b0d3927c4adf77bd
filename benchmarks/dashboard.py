"""Throughput of the keyed running count with the dashboard open vs without.

    python benchmarks/dashboard.py [--n 1000000] [--repeat 3] [--browser]
    python benchmarks/dashboard.py --screenshot docs/dashboard.png [--n 300000]

Runs, interleaved in one process (median of --repeat): ``ui=False`` and ``ui=True`` with
the dashboard polled every 0.5 s — by a client fetching what the page fetches
(``/api/overview`` and ``/metrics``), or with ``--browser`` by the real page in headless
Chromium (``?poll=500``). Prints records/s of both and the difference. Target: within
noise (the job manager publishes a snapshot at most every 0.5 s; the server only reads).

``--screenshot PATH``: one chaos run (checkpoints every 0.3 s, two random task kills)
with the page open in headless Chromium; saves the page after the job ends.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from keyed_count import build, check

from jobmanager.faults import RandomKills
from jobmanager.web import DashboardServer, close_all, serve

POLL = 0.5


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise SystemExit("needs Chromium: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="absflow-bench-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1700",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    b = webdriver.Chrome(options=options, service=Service(driver))
    b.absflow_profile = profile
    return b


class Poller:
    """Polls the newest job like the page does, every POLL seconds, until stopped."""

    def __init__(self, srv: DashboardServer, page: Any | None) -> None:
        self.srv, self.page, self.stop = srv, page, threading.Event()
        self.requests = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        opened = False
        while not self.stop.wait(POLL):
            if self.page is not None:
                if not opened:
                    self.page.get(f"{self.srv.url}?poll={int(POLL * 1000)}")
                    opened = True
                continue
            for path in ("api/overview", "metrics"):
                try:
                    with urllib.request.urlopen(self.srv.url + path, timeout=5) as res:
                        res.read()
                    self.requests += 1
                except OSError:
                    pass  # no job yet

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def timed(run: Callable[[], Any], n: int) -> float:
    started = time.perf_counter()
    result = run()
    elapsed = time.perf_counter() - started
    got = check(result, n)
    if not got["correct"]:
        raise SystemExit(f"wrong result {got}")
    return n / elapsed


def compare(n: int, repeat: int, use_browser: bool) -> None:
    srv = serve("127.0.0.1", 0, print)
    page = browser() if use_browser else None
    without: list[float] = []
    with_ui: list[float] = []
    try:
        build(10_000, 2, progress=False, ui=False).run()  # warm-up: starts Spark
        for i in range(repeat):
            without.append(timed(lambda: build(n, 2, progress=False, ui=False).run(), n))
            poller = Poller(srv, page)
            try:
                flow = build(n, 2, progress=False, ui_port=srv.port)
                with_ui.append(timed(flow.run, n))
            finally:
                poller.close()
            print(
                f"round {i + 1}: without {without[-1]:,.0f} rec/s, with dashboard "
                f"{with_ui[-1]:,.0f} rec/s ({poller.requests} API requests)"
            )
    finally:
        if page is not None:
            page.quit()
            shutil.rmtree(page.absflow_profile, ignore_errors=True)
        close_all()
    a, b = statistics.median(without), statistics.median(with_ui)
    print(
        f"keyed count, n={n:,}, parallelism 2, median of {repeat}: without dashboard "
        f"{a:,.0f} rec/s, polled every {POLL} s {b:,.0f} rec/s ({(b - a) / a:+.1%})"
    )


def screenshot(path: str, n: int) -> None:
    srv = serve("127.0.0.1", 0, print)
    page = browser()
    try:
        flow = build(n, 2, progress=False, ui_port=srv.port, checkpoint_interval=0.3)
        done = threading.Event()
        result: list[Any] = []
        kills = [RandomKills(2, seed=7, min_seconds=0.8, max_seconds=2.0)]
        job = threading.Thread(
            target=lambda: (result.append(flow.run(faults=kills)), done.set()), daemon=True
        )
        job.start()
        while not srv.jobs:
            time.sleep(0.05)
        page.get(f"{srv.url}?poll=300")
        job.join()
        time.sleep(1.5)  # the page's next polls show the final state
        page.save_screenshot(path)
        print(f"saved {path}; {result[0].summary() if result else 'the job failed'}")
    finally:
        page.quit()
        shutil.rmtree(page.absflow_profile, ignore_errors=True)
        close_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--browser", action="store_true", help="poll with the real page")
    ap.add_argument("--screenshot", help="save the page during a chaos run here")
    args = ap.parse_args()
    if args.screenshot:
        screenshot(args.screenshot, args.n)
    else:
        compare(args.n, args.repeat, args.browser)


if __name__ == "__main__":
    main()
