#!/usr/bin/env python3
"""A Python view client for the polyglot demo: prints every snapshot of the todos store until it holds
``--count`` todos, then prints the final state as JSON and exits. It rides out fluxd restarts: the client
reconnects and the subscription goes on (never the same version twice).

What it saw goes to stdout; its log (the library's lines about the connection: lost, reconnected) to stderr in
fluxd's format (``fluxbus.configure_logging``, docs/logging.md), each event once."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fluxbus import Client, configure_logging  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--store", default="todos")
parser.add_argument("--count", type=int, default=3)
args = parser.parse_args()
configure_logging()
with Client.connect(os.environ.get("FLUXBUS_SOCKET"), name="py-watch", timeout=60) as client:
    with client.subscribe(args.store) as sub:
        print("python-watch ready", flush=True)
        for snap in sub:
            titles = [t["title"] for t in snap.state.get("todos", [])]
            print(f"python saw {args.store} v{snap.version} (seq {snap.seq}): {', '.join(titles) or '(empty)'}", flush=True)
            if len(titles) >= args.count:
                print("python final " + json.dumps(snap.state, sort_keys=True, separators=(",", ":")), flush=True)
                break
