#!/usr/bin/env python3
"""A Python store worker for the polyglot demo: store "audit" counts every todo action by type.

When fluxd goes away (restarted, crashed) the store does not exit: it says so, reconnects with backoff, registers
again and goes on from the state fluxd kept (a durable fluxd) or from its own (an ephemeral one that lost it)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fluxbus import ConnectionEvent, Reject, Store, on  # noqa: E402


class Audit(Store):
    name = "audit"
    handles = ["todo/*"]
    initial_state = {"byType": {}, "lastSeq": 0}

    @on("todo/*")
    def count(self, state, payload, ctx):
        if ctx.type == "todo/create" and not (isinstance(payload, dict) and payload.get("title")):
            raise Reject("audit/untitled", "todo/create needs a title")
        state["byType"][ctx.type] = state["byType"].get(ctx.type, 0) + 1
        state["lastSeq"] = ctx.seq
        return state

    def on_registered(self, resumed):
        print("audit-store ready" + (f" (resumed at version {self.version})" if resumed else ""), flush=True)

    def on_connection_event(self, event):
        if event.kind == ConnectionEvent.DISCONNECTED:
            print(f"audit-store: lost fluxd ({event.reason}); waiting for it", flush=True)
        elif event.kind == ConnectionEvent.RECONNECTED:
            print("audit-store: reconnected" + (" (fluxd lost its state: a new epoch)" if event.epoch_changed
                                                 else ""), flush=True)
        elif event.kind == ConnectionEvent.GAVE_UP:
            print(f"audit-store: {event.reason}", flush=True)


if __name__ == "__main__":
    try:
        Audit(socket_path=os.environ.get("FLUXBUS_SOCKET")).run()
    except KeyboardInterrupt:
        pass
