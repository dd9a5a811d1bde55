import FluxDaemon
import FluxLog
import Foundation
import Logging
import Synchronization
import Testing

@Suite("fluxd's log lines: text (message first), journald, JSON")
struct LogFormatTests {
    /// 2026-11-24T00:21:07.123Z
    static let time: Int64 = 1_795_479_667_123

    private func handler(_ format: LogFormat, journald: Bool = false) -> FluxLogHandler {
        FluxLogHandler(label: "fluxd", level: .info, format: format, journald: journald, write: { _ in }, clock: { Self.time })
    }

    @Test("text: time, level, label, the message first, then the metadata sorted (quoted when it has spaces)")
    func text() {
        let line = handler(.text).line(level: .notice, message: "worker exited", metadata: ["worker": "todo", "status": "exit 1 (failure)"], source: "FluxDaemon")
        #expect(line == "2026-11-24T00:21:07.123Z notice fluxd: worker exited status=\"exit 1 (failure)\" worker=todo\n")
        let newline = handler(.text).line(level: .info, message: "a\nb", metadata: [:], source: "")
        #expect(newline == "2026-11-24T00:21:07.123Z info fluxd: a\\nb\n", "one event, one line")
    }

    @Test("a worker under fluxd (FLUXBUS_LOG_TIME=0): the level first, no time (fluxd's line for it has one)")
    func withoutTime() {
        let h = FluxLogHandler(label: "todos", level: .info, format: .text, journald: false, timestamps: false,
                               write: { _ in }, clock: { Self.time })
        #expect(h.line(level: .info, message: "seq 1 todo/create", metadata: ["peer": "7"], source: "") == "info todos: seq 1 todo/create peer=7\n")
    }

    @Test("journald: no time (the journal has it), the syslog priority first")
    func journald() {
        let h = handler(.text, journald: true)
        #expect(h.line(level: .warning, message: "slow consumer closed", metadata: ["peer": "7"], source: "") == "<4>fluxd: slow consumer closed peer=7\n")
        #expect(h.line(level: .info, message: "listening", metadata: [:], source: "") == "<6>fluxd: listening\n")
        #expect(FluxLogHandler.priority(.error) == 3 && FluxLogHandler.priority(.debug) == 7 && FluxLogHandler.priority(.critical) == 2)
    }

    @Test("json: one object per line with time, level, label, message and the metadata, every string escaped")
    func json() throws {
        let line = handler(.json).line(level: .error, message: "journal: \"disk\" full\n", metadata: ["dir": "/var/lib/fluxbus", "list": ["a", "b"]], source: "")
        #expect(line == #"{"time":"2026-11-24T00:21:07.123Z","level":"error","label":"fluxd","message":"journal: \"disk\" full\n","metadata":{"dir":"/var/lib/fluxbus","list":["a","b"]}}"# + "\n")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["message"] as? String == "journal: \"disk\" full\n")
        let bare = handler(.json).line(level: .info, message: "ready", metadata: [:], source: "")
        #expect(bare == #"{"time":"2026-11-24T00:21:07.123Z","level":"info","label":"fluxd","message":"ready"}"# + "\n")
    }

    @Test("a Logger over the handler: levels below the handler's are dropped, metadata merged, one write per line")
    func throughLogger() {
        let lines = Mutex<[String]>([])
        var logger = Logger(label: "fluxd") { label in
            FluxLogHandler(label: label, level: .info, format: .text, journald: true,
                           write: { bytes in lines.withLock { $0.append(String(decoding: bytes, as: UTF8.self)) } },
                           clock: { Self.time })
        }
        logger[metadataKey: "bus"] = "system"
        logger.debug("hidden")
        logger.info("started", metadata: ["pid": "42"])
        #expect(lines.withLock { $0 } == ["<6>fluxd: started bus=system pid=42\n"])
    }

    @Test("JOURNAL_STREAM counts only when it names stderr's device and inode")
    func journalDetection() {
        #expect(!LogDestination.isJournal(journalStream: nil))
        #expect(!LogDestination.isJournal(journalStream: "garbage"))
        var st = stat()
        fstat(2, &st)
        #expect(LogDestination.isJournal(journalStream: "\(st.st_dev):\(st.st_ino)"))
        #expect(!LogDestination.isJournal(journalStream: "\(st.st_dev):\(st.st_ino &+ 1)"))
    }
}
