import ArgumentParser
import FluxStore
import Foundation

/// `flux-bench-store`: the benchmark's store written with the Swift SDK (`FluxStore`, Codable state, Foundation's
/// JSON) instead of the C store of `Benchmarks/loadgen/`. It does the same work per action (count it, publish a
/// state of about `--state` bytes whose first field is the count), so `scripts/bench.sh` can report what the SDK
/// costs on top of fluxd (workload 7 of `Benchmarks/RESULTS.md`).
@main
struct BenchStoreCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "flux-bench-store",
        abstract: "The benchmark's Swift SDK store: stores b0 ... b<topics-1>, each counting its b<i>/act actions."
    )

    @Option(name: .long, help: "fluxd's socket.")
    var socket: String

    @Option(name: .long, help: "How many stores (topics) to serve, one connection each.")
    var topics: Int = 1

    @Option(name: .long, help: "The size of each state in bytes (approximately).")
    var state: Int = 200

    func run() async throws {
        let socket = self.socket
        // {"n":<count>,"pad":"sss…"}: the load generator reads the count after `{"n":`.
        let initial = BenchState(n: 0, pad: String(repeating: "s", count: max(0, state - 24)))
        let stores = (0..<topics).map { t in
            let store = FluxStore(name: "b\(t)", initial: initial, handles: ["b\(t)/*"])
            store.on("b\(t)/act") { state, _ in state.n += 1 }
            return store
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for store in stores {
                group.addTask { try await store.run(socketPath: socket, peerName: "flux-bench-store") }
            }
            for store in stores { try await store.ready() }
            FileHandle.standardOutput.write(Data("store ready\n".utf8))  // unbuffered: the driver waits for it
            try await group.next()
        }
    }
}

/// The benchmark state: a counter and padding (the count is encoded first).
struct BenchState: Codable, Equatable, Sendable {
    var n: Int
    var pad: String
}
