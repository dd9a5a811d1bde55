import DequeModule
import FluxCore

// Observers: monitor events (SPEC §8.10) and counters.
extension Router {
    // MARK: - Monitor events

    /// Sends one `event` to every monitor; the frame is built only when a monitor is connected. (Inlined, so that
    /// without monitors the caller does not even build the closure and retain what it captures.)
    @inline(__always)
    func emit(_ kind: StaticString, _ out: inout Output, _ fields: (inout FrameBuilder) -> Void) {
        guard !monitors.isEmpty else { return }
        emitNow(kind, &out, fields)
    }

    func emitNow(_ kind: StaticString, _ out: inout Output, _ fields: (inout FrameBuilder) -> Void) {
        var b = FrameBuilder(op: "event")
        b.constant("kind", kind)
        b.int("t", now - (epoch ?? now))
        fields(&b)
        let frame = b.finish()
        for id in monitors {
            if let p = peers[id], !p.closing { out.append(.monitor(id, frame)) }
        }
    }
}
