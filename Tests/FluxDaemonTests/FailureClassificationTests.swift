import Glibc
import Testing
@testable import FluxDaemon
import FluxTransport

/// Which failed worker starts are retried, and how accept failures are counted and rate-limited.
struct SpawnFailureTests {
    @Test("a missing or non-executable command is permanent",
          arguments: [ENOENT, EACCES, ENOEXEC, ENOTDIR, ELOOP, ENAMETOOLONG])
    func permanent(errno: Int32) {
        #expect(SpawnFailure(uvCode: -errno) == .permanent)
    }

    @Test("running out of something is transient (retried with backoff)",
          arguments: [EMFILE, ENFILE, EAGAIN, ENOMEM, ENOSPC, EINTR, EBUSY, ETXTBSY, EIO, EPERM])
    func transient(errno: Int32) {
        #expect(SpawnFailure(uvCode: -errno) == .transient)
    }

    @Test("libuv's codes are negated errno values (what ChildProcess.spawn reports)")
    func uvCodes() {
        #expect(UVError(code: -EMFILE, operation: "uv_spawn").name == "EMFILE")
        #expect(UVError(code: -ENOENT, operation: "uv_spawn").name == "ENOENT")
    }
}

struct AcceptFailureLogTests {
    @Test("the first failure is logged at once; more within a second are counted, not logged")
    func rateLimited() {
        var log = AcceptFailureLog(interval: 1000)
        #expect(log.record("EMFILE", now: 10_000) == .init(name: "EMFILE", suppressed: 0, suppressedByName: [:], total: 1))
        for t in stride(from: 10_001, to: 10_999, by: 100) { #expect(log.record("EMFILE", now: UInt64(t)) == nil) }
        #expect(log.record("ENFILE", now: 10_999) == nil)
        #expect(log.total == 12)
        #expect(log.counts == ["EMFILE": 11, "ENFILE": 1])
        // The next one after the interval is logged with what was suppressed since the last line.
        #expect(log.record("EMFILE", now: 11_000)
                == .init(name: "EMFILE", suppressed: 11, suppressedByName: ["EMFILE": 10, "ENFILE": 1], total: 13))
        #expect(log.record("EMFILE", now: 11_500) == nil)
        #expect(log.record("EMFILE", now: 20_000) == .init(name: "EMFILE", suppressed: 1, suppressedByName: ["EMFILE": 1], total: 15))
        #expect(log.counts == ["EMFILE": 14, "ENFILE": 1])
    }

    @Test("a burst of any size gives one line per second")
    func burst() {
        var log = AcceptFailureLog(interval: 1000)
        var lines = 0
        for i in 0..<10_000 where log.record("EMFILE", now: UInt64(i / 2)) != nil { lines += 1 }
        #expect(lines == 5) // 0, 1000, 2000, 3000, 4000 ms
        #expect(log.total == 10_000)
    }

    @Test("the log line's metadata: the error, the total, and what was suppressed")
    func metadata() {
        let report = AcceptFailureLog.Report(name: "EMFILE", suppressed: 3, suppressedByName: ["ENFILE": 1, "EMFILE": 2], total: 9)
        let metadata = report.metadata(UVError(code: -EMFILE, operation: "accept"))
        #expect(metadata["error"] == "too many open files (EMFILE)")
        #expect(metadata["total"] == "9")
        #expect(metadata["suppressed"] == "3")
        #expect(metadata["suppressed_by_error"] == "EMFILE=2,ENFILE=1")
    }
}
