import Foundation
import Glibc
import Testing

/// fluxd reads the journal for `history` and `state-at` on its reader thread, not on its loop (issue 25): with the
/// read held by the test seam `FLUXD_TEST_HOLD_READS` (each read waits for a byte on a FIFO), other requests are
/// answered meanwhile. Deterministic: the read is held until the test releases it, nothing is timed.
@Suite("journal reads off fluxd's loop", .onDedicatedThreads)
struct JournalReadTests {
    @Test("while a history read is held, info from another peer (and from the reader itself) is answered; a reader that closes before its answer costs nothing; released, the history comes")
    func historyReadDoesNotHoldTheLoop() throws {
        let temp = try TempDirectory(prefix: "fluxreads")
        defer { temp.remove() }
        let hold = temp.path + "/hold"
        guard mkfifo(hold, 0o600) == 0 else { throw HarnessError.system("mkfifo", errno) }
        var environment = ProcessInfo.processInfo.environment
        environment["FLUXD_TEST_HOLD_READS"] = hold
        let fluxd = try Fluxd(environment: environment, dataDirectory: temp.path + "/data")
        defer { fluxd.cleanup() }
        try fluxd.waitForReady()

        let reader = try RawPeer.ready(fluxd.socketPath, name: "reader")  // fluxd's own uid: privileged
        let other = try RawPeer.ready(fluxd.socketPath, name: "other")
        let leaver = try RawPeer.ready(fluxd.socketPath, name: "leaver")
        try reader.send(frame: #"{"op":"history","id":"h1","limit":10}"#)
        try leaver.send(frame: #"{"op":"state-at","id":"s1","store":"todos","seq":1}"#)
        // The reads wait on the FIFO: were they on the loop, nothing below would be answered.
        try other.send(frame: #"{"op":"info","id":"i1"}"#)
        #expect(try other.expect("info").string("id") == "i1")
        try reader.send(frame: #"{"op":"info","id":"i2"}"#)
        #expect(try reader.expect("info").string("id") == "i2", "the reader's own info comes before its held history")
        // The leaver closes before its answer: wait (round trips, with a deadline) until fluxd has seen it go.
        Glibc.shutdown(leaver.fd, Int32(SHUT_RDWR))
        let deadline = ContinuousClock.now + .seconds(20)
        while true {
            try other.send(frame: #"{"op":"info","id":"c"}"#)
            let load = try other.expect("info").object["load"] as? [String: Any]
            if load?["connections"] as? Int == 2 { break }
            guard ContinuousClock.now < deadline else { throw HarnessError.timedOut("fluxd to see the leaver close") }
        }

        // Release both reads (the FIFO opened read-write never blocks; the bytes wait in it until read).
        let fd = open(hold, O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { throw HarnessError.system("open \(hold)", errno) }
        defer { Glibc.close(fd) }
        var bytes: [UInt8] = [1, 1]
        guard write(fd, &bytes, 2) == 2 else { throw HarnessError.system("write \(hold)", errno) }
        let history = try reader.expect("history")
        #expect(history.string("id") == "h1")
        #expect(history.objects("entries").isEmpty)
        // The left peer's answer was dropped; fluxd goes on serving.
        try other.send(frame: #"{"op":"info","id":"i3"}"#)
        #expect(try other.expect("info").string("id") == "i3")
    }
}
