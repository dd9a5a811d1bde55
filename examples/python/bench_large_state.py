#!/usr/bin/env python3
"""Large-state benchmark of the Python library (issue 16, workload 8): a store holding N todos (10,000: ~860 KB of
JSON), each action toggles one, K subscribers read the toggled todo after each change. Prints JSON.

Usage (a fluxd must be listening on SOCKET; start it with --ephemeral, and --max-frame 4194304 for more
than ~11,000 todos):

    python3 examples/python/bench_large_state.py --socket SOCKET --role all [--mode patch|full|both]
        [--todos 10000] [--actions 200] [--subscribers 10] [--handler draft|shared|copy]

        Runs the store and the subscribers as processes of their own and dispatches from this one; prints one
        JSON object per mode: {"mode", "handler", "todos", "state_bytes", "actions", "subscribers",
        "store_cpu_us_per_action", "subscriber_cpu_us_per_change" (mean over subscribers),
        "subscriber_bytes_per_change" (frame bytes received per change, mean), "actions_per_s",
        "dispatcher_seconds"}. --mode both runs full then patch against the same fluxd (A/B in one run).

    python3 examples/python/bench_large_state.py --socket SOCKET --role store --mode M --actions A [...]
        The store alone: registers store "bigtodos-M", prints {"role": "store", "ready": true} once registered,
        then after A actions {"role": "store", "store_cpu_us_per_action", ...} and exits.

    python3 examples/python/bench_large_state.py --socket SOCKET --role client --mode M --actions A [...]
        One subscriber: prints {"role": "client", "ready": true, "first_state_ms"} once it holds the first snapshot
        (ms from subscribe to the state), then after A changes {"role": "client", "subscriber_cpu_us_per_change",
        "subscriber_bytes_per_change", "bytes_received", ...} and exits (--actions 0: at once).

    python3 examples/python/bench_large_state.py --socket SOCKET --role dispatch --mode M --actions A
        Dispatches A toggles (pipelined, the last one settled) and prints {"role": "dispatch", "seconds"}.

    python3 examples/python/bench_large_state.py --role offline [--todos 10000] [--actions 200]
        No fluxd: the library's own CPU per action and per change, in this process, for the store (handler,
        change, frame) with each handler mode, full state vs patch, and for a subscriber (decode a snapshot
        frame vs decode a delta frame and apply it). Prints one JSON object.

--mode full: the store sends whole states (patches off) and subscribers take whole snapshots (deltas off), as
before SPEC §16; --mode patch: done.patch and delta subscriptions. CPU is the process's user+system time
(getrusage), counted from the first action (store) or the first snapshot (subscribers).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fluxbus import Client, Store, on  # noqa: E402
from fluxbus.wire import dumps  # noqa: E402


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def initial_state(count: int) -> dict:
    return {"todos": [{"id": i, "title": f"todo number {i}: buy milk and eggs",
                       "done": False, "createdSeq": i} for i in range(1, count + 1)], "nextID": count + 1}


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def store_name(mode: str) -> str:
    return f"bigtodos-{mode}"


def run_store(args) -> None:
    counted = {"n": 0, "start": 0.0}

    class BigTodos(Store):
        name = store_name(args.mode)
        handles = [f"{name}/*"]
        patches = args.mode == "patch"
        handler_state = args.handler
        reconnect = False

        @on(f"{name}/toggle")
        def toggle(self, state, payload, ctx):
            if counted["n"] == 0:
                counted["start"] = cpu()
            counted["n"] += 1
            index = payload["id"] - 1  # ids are positions + 1 here; the handler still checks
            todos = state["todos"]
            todo = todos[index]
            if todo["id"] != payload["id"]:
                raise ValueError("not found")
            if self.handler_state == "shared":
                todos = list(todos)
                todos[index] = {**todo, "done": not todo["done"]}
                return {**state, "todos": todos}
            todo["done"] = not todo["done"]
            return state

        def on_registered(self, resumed):
            emit(role="store", ready=True, name=self.name)

    store = BigTodos(socket_path=args.socket)
    store.initial_state = initial_state(args.todos)
    store.start()
    while counted["n"] < args.actions:
        time.sleep(0.01)  # (a benchmark's idle wait, not a test's synchronisation)
    time.sleep(0.05)  # let the last answer go out
    spent = cpu() - counted["start"]
    emit(role="store", mode=args.mode, handler=args.handler, actions=counted["n"],
         patches_sent=store.patches_sent, states_sent=store.states_sent,
         store_cpu_us_per_action=round(spent / counted["n"] * 1e6, 1))
    store.stop()


def run_client(args) -> None:
    client = Client.connect(args.socket, name="bench-subscriber", timeout=60, reconnect=False)
    name = store_name(args.mode)
    subscribed_at = time.monotonic()
    sub = client.subscribe(name, deltas=args.mode == "patch", timeout=60)
    first = sub.next()
    first_state_ms = round((time.monotonic() - subscribed_at) * 1000, 1)
    emit(role="client", ready=True, first_state_ms=first_state_ms)
    start_cpu = cpu()
    bytes_before = _bytes_received(client)
    changes = 0
    last = first.version
    toggled_done = None
    while last < first.version + args.actions:
        snap = sub.next(timeout=120)
        changes += 1
        last = snap.version
        toggled_done = snap.state["todos"][(snap.seq - 1) % args.todos]["done"]  # read the toggled todo
    spent = cpu() - start_cpu
    received = _bytes_received(client) - bytes_before
    emit(role="client", mode=args.mode, changes=changes, versions=last - first.version,
         first_state_ms=first_state_ms, bytes_received=received,
         deltas_applied=sub.deltas_applied, resyncs=sub.resyncs, last_read=toggled_done,
         subscriber_cpu_us_per_change=round(spent / max(changes, 1) * 1e6, 1),
         subscriber_bytes_per_change=round(received / max(changes, 1)))
    client.abort()


def _bytes_received(client: Client) -> int:
    return _RECEIVED.get(id(client), 0)


_RECEIVED = {}


def _count_bytes() -> None:
    """Wraps the frame decoder so that each client counts the bytes it reads (for bytes per change)."""
    import fluxbus.client as client_module
    original = client_module.Client._read_connection

    def counting(self, sock, decoder, leftovers):
        feed = decoder.feed

        def counted_feed(data):
            _RECEIVED[id(self)] = _RECEIVED.get(id(self), 0) + len(data)
            return feed(data)
        decoder.feed = counted_feed
        return original(self, sock, decoder, leftovers)
    client_module.Client._read_connection = counting


def run_dispatch(args) -> float:
    client = Client.connect(args.socket, name="bench-dispatcher", timeout=120, reconnect=False)
    name = store_name(args.mode)
    start = time.monotonic()
    for n in range(args.actions - 1):
        client.dispatch(f"{name}/toggle", {"id": n % args.todos + 1})
    client.dispatch_and_settle(f"{name}/toggle", {"id": (args.actions - 1) % args.todos + 1})
    seconds = time.monotonic() - start
    client.close()
    return seconds


def spawn(args, role: str, mode: str) -> subprocess.Popen:
    command = [sys.executable, os.path.abspath(__file__), "--socket", args.socket, "--role", role, "--mode", mode,
               "--todos", str(args.todos), "--actions", str(args.actions), "--handler", args.handler]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def read_json(process: subprocess.Popen) -> dict:
    line = process.stdout.readline()
    if not line:
        raise SystemExit(f"bench: a {process.args[6]} process ended without output (exit {process.wait()})")
    return json.loads(line)


def run_all(args, mode: str) -> dict:
    store = spawn(args, "store", mode)
    read_json(store)
    clients = [spawn(args, "client", mode) for _ in range(args.subscribers)]
    for each in clients:
        read_json(each)
    args.mode = mode
    seconds = run_dispatch(args)
    store_result = read_json(store)
    client_results = [read_json(each) for each in clients]
    for process in [store, *clients]:
        process.wait(60)
    return {"mode": mode, "handler": args.handler, "todos": args.todos,
            "state_bytes": len(dumps(initial_state(args.todos))), "actions": args.actions,
            "subscribers": args.subscribers,
            "store_cpu_us_per_action": store_result["store_cpu_us_per_action"],
            "subscriber_cpu_us_per_change": round(sum(c["subscriber_cpu_us_per_change"] for c in client_results)
                                                  / max(len(client_results), 1), 1),
            "subscriber_bytes_per_change": round(sum(c["subscriber_bytes_per_change"] for c in client_results)
                                                 / max(len(client_results), 1)),
            "subscriber_changes_seen": [c["changes"] for c in client_results],
            "actions_per_s": round(args.actions / seconds, 1), "dispatcher_seconds": round(seconds, 3)}


def run_offline(args) -> dict:
    """The library's CPU per action (store) and per change (subscriber), without fluxd: what the store does
    between an action and its answer's bytes, and what a subscriber does between a frame's bytes and the state."""
    import fluxbus.wire as wire
    from fluxbus import ActionContext
    from fluxbus._core import SubscriptionCore
    results = {"role": "offline", "todos": args.todos, "state_bytes": len(dumps(initial_state(args.todos))),
               "actions": args.actions}

    class Sink:
        def done(self, seq, state=None, patch=None, base=None):
            Client._change_frame({"op": "done", "store": "b", "seq": seq}, state, patch, base)
            return True

    def store_run(handler: str, patches: bool) -> float:
        class Offline(Store):
            name = "b"
            handles = ["b/*"]
            handler_state = handler

            @on("b/toggle")
            def toggle(self, state, payload, ctx):
                index = payload["id"] - 1
                if handler == "shared":
                    todos = list(state["todos"])
                    todos[index] = {**todos[index], "done": not todos[index]["done"]}
                    return {**state, "todos": todos}
                state["todos"][index]["done"] = not state["todos"][index]["done"]
                return state
        store = Offline()
        store.patches = patches
        store.state, store.version, store._base_known = initial_state(args.todos), 1, True
        store.client = type("C", (), {"speaks_deltas": lambda self: True})()
        store.registration = Sink()
        start = cpu()
        for n in range(args.actions):
            msg = {"seq": n + 1, "type": "b/toggle", "origin": 1, "payload": {"id": n * 7919 % args.todos + 1}}
            ctx = ActionContext(store, msg)
            kind, body = store._result_answer(ctx, store.handler_for("b/toggle")(store._handler_state(),
                                                                                   msg["payload"], ctx))
            store.registration.done(ctx.seq, **(body or {}))
        return (cpu() - start) / args.actions * 1e6

    for handler in ("copy", "draft", "shared"):
        results[f"store_cpu_us_per_action_full_{handler}"] = round(store_run(handler, False), 1)
        results[f"store_cpu_us_per_action_patch_{handler}"] = round(store_run(handler, True), 1)
    state = initial_state(args.todos)
    snapshot_body = b'{"op":"snapshot","store":"b","version":2,"seq":1,"state":' + dumps(state) + b"}"
    count = max(5, args.actions // 10)
    start = cpu()
    for _ in range(count):
        msg = wire.loads(snapshot_body)
        msg["state"]["todos"][0]["done"]  # read the toggled todo
    results["subscriber_cpu_us_per_change_full"] = round((cpu() - start) / count * 1e6, 1)
    results["subscriber_bytes_per_change_full"] = len(snapshot_body) + 4

    class Holder(SubscriptionCore):
        def _enqueue(self, snap):
            pass
    holder = Holder(type("C", (), {"speaks_deltas": lambda self: True})(), "b", None, True)
    holder._accept(wire.Snapshot("b", 1, 0, state))
    bodies = []
    for n in range(args.actions):
        index = n * 7919 % args.todos
        patch = [{"op": "replace", "path": f"/todos/{index}/done", "value": n % 2 == 0}]
        bodies.append((index, b'{"op":"delta","store":"b","from":%d,"version":%d,"seq":%d,"patch":%s}'
                       % (n + 1, n + 2, n + 1, dumps(patch))))
    start = cpu()
    for index, body in bodies:
        holder._deliver(wire.loads(body))
        holder.latest.state["todos"][index]["done"]  # read the toggled todo
    results["subscriber_cpu_us_per_change_patch"] = round((cpu() - start) / args.actions * 1e6, 1)
    results["subscriber_bytes_per_change_patch"] = round(sum(len(b) + 4 for _, b in bodies) / len(bodies))
    assert holder.deltas_applied == args.actions
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket")
    parser.add_argument("--role", choices=["all", "store", "client", "dispatch", "offline"], default="all")
    parser.add_argument("--mode", choices=["patch", "full", "both"], default="both")
    parser.add_argument("--handler", choices=["draft", "shared", "copy"], default="draft")
    parser.add_argument("--todos", type=int, default=10000)
    parser.add_argument("--actions", type=int, default=200)
    parser.add_argument("--subscribers", type=int, default=10)
    args = parser.parse_args()
    if args.role == "offline":
        emit(**run_offline(args))
        return
    if not args.socket:
        parser.error("--socket is required (except with --role offline)")
    _count_bytes()
    if args.role == "store":
        run_store(args)
    elif args.role == "client":
        run_client(args)
    elif args.role == "dispatch":
        emit(role="dispatch", mode=args.mode, seconds=round(run_dispatch(args), 3))
    else:
        for mode in (["full", "patch"] if args.mode == "both" else [args.mode]):
            emit(**run_all(args, mode))


if __name__ == "__main__":
    main()
