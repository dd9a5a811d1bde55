import Foundation
import Glibc
import Testing

@Suite("fluxd --log-format", .onDedicatedThreads)
struct LogFormatIntegrationTests {
    @Test("json: every stderr line is one JSON object with time, level, label and message; each operator line once")
    func jsonLines() throws {
        let fluxd = try Fluxd(arguments: ["--log-format", "json"])
        defer { fluxd.cleanup() }
        try fluxd.waitForReady()
        let dir = try TempDirectory(prefix: "fluxlog")
        defer { dir.remove() }
        let store = try StoreProcess("todo-store", socketPath: fluxd.socketPath, logDirectory: dir.path)
        defer { store.cleanup() }
        try store.waitForLine(containing: "todo-store ready")
        fluxd.send(signal: SIGTERM)
        #expect(fluxd.waitForExit(timeout: .seconds(20)) == 0)

        let lines = fluxd.stderr.split(separator: "\n", omittingEmptySubsequences: true)
        #expect(!lines.isEmpty)
        var messages: [String] = []
        for line in lines {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "not JSON: \(line)")
            let time = try #require(object["time"] as? String, "\(line)")
            #expect(time.hasSuffix("Z") && time.count == 24, "RFC 3339 UTC with milliseconds: \(time)")
            #expect(["trace", "debug", "info", "notice", "warning", "error", "critical"].contains(object["level"] as? String ?? ""))
            #expect(object["label"] as? String == "fluxd")
            messages.append(try #require(object["message"] as? String))
        }
        for once in ["fluxd 0.4.0 starting", "listening", "ready", "shutting down", "stopped"] {
            #expect(messages.filter { $0 == once }.count == 1, "\(once): \(messages)")
        }
        let listening = try #require(lines.first { $0.contains(#""message":"listening""#) })
        #expect(listening.contains(#""metadata":{"mode":"600","path":"\#(fluxd.socketPath)"}"#), "\(listening)")
    }

    @Test("text: the message comes right after the label, metadata after it; a bad --log-format is refused")
    func textLines() throws {
        let fluxd = try Fluxd(arguments: ["--log-format", "text"])
        defer { fluxd.cleanup() }
        try fluxd.waitForReady()
        fluxd.send(signal: SIGTERM)
        #expect(fluxd.waitForExit(timeout: .seconds(20)) == 0)
        #expect(fluxd.stderr.contains(" info fluxd: listening mode=600 path=\(fluxd.socketPath)\n"), "\(fluxd.stderr)")

        let bad = try Fluxd(arguments: ["--log-format", "xml"])
        defer { bad.cleanup() }
        #expect(bad.waitForExit(timeout: .seconds(20)) != 0)
        #expect(bad.stderr.contains("--log-format must be text or json"), "\(bad.stderr)")
    }
}
