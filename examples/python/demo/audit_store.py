#!/usr/bin/env python3
"""A Python store worker for the polyglot demo: store "audit" counts every todo action by type.

When fluxd goes away (restarted, crashed) the store does not exit: it reconnects with backoff, registers again and
goes on from the state fluxd kept (a durable fluxd) or from its own (an ephemeral one that lost it).

stdout has one line, ``audit-store ready``, once it is first registered (what scripts wait for). Everything else is
its log on stderr in fluxd's format (``fluxbus.configure_logging``, docs/logging.md), each event once: the library
logs the connection's loss and return (label ``fluxbus``), the store what it does (label ``audit-store``)."""
import logging
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fluxbus import Reject, Store, configure_logging, on  # noqa: E402

log = logging.getLogger("audit-store")


class Audit(Store):
    name = "audit"
    handles = ["todo/*"]
    initial_state = {"byType": {}, "lastSeq": 0}
    registered_once = False

    @on("todo/*")
    def count(self, state, payload, ctx):
        if ctx.type == "todo/create" and not (isinstance(payload, dict) and payload.get("title")):
            raise Reject("audit/untitled", "todo/create needs a title")
        state["byType"][ctx.type] = state["byType"].get(ctx.type, 0) + 1
        state["lastSeq"] = ctx.seq
        log.info("counted %s", ctx.type, extra={"seq": ctx.seq, "count": state["byType"][ctx.type]})
        return state

    def on_registered(self, resumed):
        if not self.registered_once:
            self.registered_once = True
            print("audit-store ready", flush=True)
        else:  # after a reconnection (the library logged the loss and the return)
            log.info("registered again", extra={"resumed": resumed, "version": self.version})


def main():
    configure_logging()
    audit = Audit(socket_path=os.environ.get("FLUXBUS_SOCKET"))

    def stop(signum, _frame):
        log.info("signal %d: unregistering", signum)
        audit.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    audit.run()


if __name__ == "__main__":
    main()
