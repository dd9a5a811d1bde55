import FluxClient
import Foundation
import Glibc
import Testing

/// README's five-minute tour, played (issue 26): its commands, taken from README's own text, against a durable
/// fluxd with the example stores, their output checked against the lines README shows under them. The large-state
/// step runs with a smaller count (CI time) and must finish; its stats store must count every todo.
@Suite("README's tour, as written", .serialized)
struct TourTests {
    /// The tour's shell text (every ```sh block between "## A five-minute tour" and the next section).
    private func tourText() throws -> String {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        let readme = try String(contentsOfFile: url.path + "/README.md", encoding: .utf8)
        let start = try #require(readme.range(of: "## A five-minute tour"))
        let rest = readme[start.upperBound...]
        let section = rest[..<(rest.range(of: "\n## ")?.lowerBound ?? rest.endIndex)]
        return section.components(separatedBy: "```sh\n").dropFirst()
            .map { $0.components(separatedBy: "```")[0] }.joined()
    }

    /// The line of the tour that starts with `command` (its comment cut off), and the comment lines under it.
    private func step(_ tour: String, _ command: String) throws -> (line: String, shown: [String]) {
        let lines = tour.components(separatedBy: "\n")
        let index = try #require(lines.firstIndex { $0.hasPrefix(command) }, "README's tour has no line starting \(command)")
        var shown: [String] = []
        for line in lines[(index + 1)...] {
            guard line.hasPrefix("#") else { break }
            shown.append(String(line.dropFirst()))
        }
        return (lines[index], shown)
    }

    /// Spaces collapsed and ends trimmed (README aligns its columns by hand).
    private func squeeze(_ s: String) -> String {
        s.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
    }

    @Test("dispatch --wait, a rejection, no handler, state --raw, watch's diff, and the large-state step: what README shows")
    func tourAsWritten() async throws {
        let tour = try tourText()
        let data = try TempDirectory(prefix: "fluxtour")
        defer { data.remove() }
        try await withBus(["--data-dir", data.path]) { bus in
            _ = try await bus.start("todo-store")
            _ = try await bus.start("stats-store")
            let probe = try await bus.connect("tour")
            for _ in 0..<200 where (try await probe.info().stores.first { $0.name == "stats" }?.status) != "up" {
                try await Task.sleep(for: .milliseconds(20))  // polling interval: fluxd's info decides
            }

            // fluxctl dispatch todo/create '{"title":"buy milk"}' --wait, and the settlement README prints.
            let create = try step(tour, #"fluxctl dispatch todo/create '{"title":"buy milk"}' --wait"#)
            let created = try await bus.ctl("dispatch", "todo/create", #"{"title":"buy milk"}"#, "--wait")
            #expect(created.status == 0, "\(created)")
            for shown in create.shown {
                let text = squeeze(shown.components(separatedBy: "<-")[0])
                #expect(squeeze(created.stdout).contains(text), "README shows \(text); fluxctl printed:\n\(created.stdout)")
            }

            let toggle = try step(tour, #"fluxctl dispatch todo/toggle '{"id":99}' --wait"#)
            #expect(toggle.line.contains("exit code 1"))
            let rejected = try await bus.ctl("dispatch", "todo/toggle", #"{"id":99}"#, "--wait")
            #expect(rejected.status == 1)
            for shown in toggle.shown {
                #expect(squeeze(rejected.stdout).contains(squeeze(shown)), "README shows \(shown); fluxctl printed:\n\(rejected.stdout)")
            }

            let cart = try step(tour, #"fluxctl dispatch cart/add '{}'"#)
            let noHandler = try await bus.ctl("dispatch", "cart/add", "{}")
            #expect(noHandler.status == 1)
            let shownError = try #require(cart.shown.first).components(separatedBy: "(exit code")[0]
            #expect(noHandler.stderr.trimmingCharacters(in: .whitespacesAndNewlines) == shownError.trimmingCharacters(in: .whitespaces), "\(noHandler)")

            let raw = try step(tour, "T=$(fluxctl state todos --path /todos/0/title --raw)")
            #expect(raw.line.contains(#"T='"buy milk"'"#))
            let title = try await bus.ctl("state", "todos", "--path", "/todos/0/title", "--raw")
            #expect(title.stdout == "\"buy milk\"\n", "\(title)")

            // fluxctl watch todos &, then the toggle, and the diff README shows.
            let watchStep = try step(tour, #"fluxctl dispatch todo/toggle '{"id":1}'"#)
            let watch = try FluxctlProcess(["watch", "todos"], socket: bus.socketPath)
            defer { watch.cleanup() }
            try await watch.wait("the retained state") { $0.contains("version 2") }
            #expect(try await bus.ctl("dispatch", "todo/toggle", #"{"id":1}"#).status == 0)
            for shown in watchStep.shown {
                try await watch.wait("README's \(shown)") { squeeze($0).contains(squeeze(shown)) }
            }

            // The large-state step, with 300 todos instead of 10,000: it finishes, and stats counted every todo.
            let large = try step(tour, #"fluxctl dispatch todo/create '{"title":"one of many"}' --count 10000 --wait"#)
            #expect(large.line.contains("~860 KB of state"))
            let many = try await bus.ctl("dispatch", "todo/create", #"{"title":"one of many"}"#, "--count", "300", "--wait")
            #expect(many.status == 0, "\(many.stderr)")
            struct Stats: Decodable { var total: Int }
            #expect(try await probe.get(store: "stats", as: Stats.self).state.total == 301)
            await probe.close()
        }
    }
}
