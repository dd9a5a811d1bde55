#!/usr/bin/env python3
"""How one metrics scrape scales with the stores and their reject codes (issue 25, item 3).

    python3 Benchmarks/metrics-scale.py FLUXD [FLUXD ...] [--stores 1000] [--codes 64] [--scrapes 3]

For each fluxd binary (e.g. the one before and the one after a change, measured in one run): starts
`fluxd --ephemeral --metrics 127.0.0.1:0` on a private socket; one store connection registers `--stores` stores and
rejects every action with the code its type names; a client dispatches `--codes` actions per store, one per code
(so fluxd holds stores x codes rejected-code series); then times `--scrapes` scrapes of /metrics in a row, each followed by an
`info` round trip (which waits for whatever holds fluxd's loop), and reads `info.load.longestLoopHoldMicros` before
and after them. Prints one JSON line per fluxd. Loopback and private
sockets only; every fluxd is stopped by pid.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attack import enc, fill_reject_series, op_of, ready_peer  # noqa: E402


def info_load(sock):
    p = ready_peer(sock, name="info")
    try:
        p.send(enc({"op": "info", "id": "i"}))
        body = p.until(lambda b: op_of(b) == "info", 60, "info")
        return json.loads(body)["load"]
    finally:
        p.close()


def measure(fluxd, stores, codes, scrapes):
    tmp = tempfile.mkdtemp(prefix="fluxbus-metrics-scale-")
    sock = os.path.join(tmp, "fluxd.sock")
    log = open(os.path.join(tmp, "fluxd.log"), "wb")
    proc = subprocess.Popen([fluxd, "--ephemeral", "--socket", sock, "--metrics", "127.0.0.1:0",
                             "--log-level", "info"], stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    try:
        url = None
        deadline = time.time() + 30
        while url is None and time.time() < deadline:
            text = open(os.path.join(tmp, "fluxd.log"), "rb").read().decode(errors="replace")
            m = re.search(r"metrics on (http://\S+/metrics)", text)
            url = m.group(1) if m else None
            time.sleep(0.05)
        if url is None:
            raise RuntimeError("fluxd did not say where its metrics are")
        store = ready_peer(sock, role="store", name="rejecter")
        for i in range(stores):
            store.send(enc({"op": "register", "store": f"s{i}", "handles": [f"s{i}/*"]}))
            body = store.until(lambda b: op_of(b) in ("registered", "error"), 30, f"registered s{i}")
            if op_of(body) != "registered":
                raise RuntimeError(f"register s{i}: {body[:200]!r}")
        client = ready_peer(sock, name="dispatcher")
        t0 = time.time()
        fill_reject_series(store, client, stores, codes)
        fill = time.time() - t0
        # Every reject recorded (the last one's round trip through info).
        before = info_load(sock)["longestLoopHoldMicros"]
        times, sizes, infos = [], [], []
        for _ in range(scrapes):
            s0 = time.time()
            with urllib.request.urlopen(url, timeout=600) as r:
                body = r.read()
            times.append(round(time.time() - s0, 3))
            sizes.append(len(body))
            # The loop's own answer right after the scrape: a refresh that holds the loop shows here (a scrape
            # gives up waiting for it after 1 s and serves the previous values).
            i0 = time.time()
            info_load(sock)
            infos.append(round(time.time() - i0, 3))
        after = info_load(sock)["longestLoopHoldMicros"]
        series = body.count(b"\nfluxbus_actions_rejected_total{")
        store.close()
        client.close()
        return {"fluxd": fluxd, "stores": stores, "codes": codes, "fill_seconds": round(fill, 1),
                "scrape_seconds": times, "info_after_scrape_seconds": infos, "scrape_bytes": sizes[-1], "rejected_series": series,
                "loop_hold_before_us": before, "loop_hold_after_us": after}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fluxd", nargs="+")
    ap.add_argument("--stores", type=int, default=1000)
    ap.add_argument("--codes", type=int, default=64)
    ap.add_argument("--scrapes", type=int, default=3)
    args = ap.parse_args()
    for fluxd in args.fluxd:
        print(json.dumps(measure(fluxd, args.stores, args.codes, args.scrapes)), flush=True)


if __name__ == "__main__":
    main()
