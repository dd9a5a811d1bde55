// Per-frame costs inside one process: what fluxd pays to read a frame's envelope, and what a Swift SDK store pays
// to encode its state with Foundation (reported beside the broker figures in RESULTS.md).
import Benchmark
import FluxCore
import Foundation

/// A 100-byte-payload dispatch, as the load generator sends it.
private let dispatchBody = Array(#"{"op":"dispatch","type":"b0/act","payload":{"pad":"\#(String(repeating: "a", count: 90))"}}"#.utf8)
/// A `done` with a 200-byte state.
private let doneBody = Array(#"{"op":"done","store":"b0","seq":42,"state":{"n":42,"pad":"\#(String(repeating: "s", count: 180))"}}"#.utf8)
/// A `done` with a ~10 KB state.
private let bigDoneBody = Array(#"{"op":"done","store":"b0","seq":42,"state":{"n":42,"items":[\#((0..<200).map { #"{"id":\#($0),"title":"item number \#($0)","done":false}"# }.joined(separator: ","))]}}"#.utf8)

private func framed(_ body: [UInt8]) -> [UInt8] {
    let n = UInt32(body.count)
    return [UInt8(n >> 24), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)] + body
}

/// A store state as an SDK user would write it.
private struct TodoState: Codable, Sendable {
    struct Item: Codable, Sendable { var id: Int; var title: String; var done: Bool }
    var items: [Item]
}

private let smallState = TodoState(items: (0..<3).map { .init(id: $0, title: "item number \($0)", done: false) })
private let bigState = TodoState(items: (0..<200).map { .init(id: $0, title: "item number \($0)", done: false) })

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(metrics: [.wallClock, .mallocCountTotal, .instructions],
                                           maxDuration: .seconds(2), maxIterations: 1_000_000)

    Benchmark("Envelope scan: dispatch (114 B)") { benchmark in
        for _ in benchmark.scaledIterations { blackHole(try? Envelope(body: dispatchBody)) }
    }
    Benchmark("Envelope scan: done with 200 B state") { benchmark in
        for _ in benchmark.scaledIterations { blackHole(try? Envelope(body: doneBody)) }
    }
    Benchmark("Envelope scan: done with 10 KB state") { benchmark in
        for _ in benchmark.scaledIterations { blackHole(try? Envelope(body: bigDoneBody)) }
    }
    Benchmark("FrameDecoder: 200 B frame in, frame out") { benchmark in
        let bytes = framed(doneBody)
        var decoder = FrameDecoder(maxFrame: 1_048_576)
        for _ in benchmark.scaledIterations {
            bytes.withUnsafeBytes { decoder.append($0) }
            blackHole(decoder.next())
        }
    }
    Benchmark("FrameBuilder: snapshot around a 200 B state") { benchmark in
        let envelope = try! Envelope(body: doneBody)
        let state = envelope.raw("state")!
        for _ in benchmark.scaledIterations {
            var b = FrameBuilder(op: "snapshot")
            b.string("store", "b0")
            b.int("version", 42)
            b.int("seq", 42)
            b.raw("state", state)
            blackHole(b.finish())
        }
    }
    Benchmark("SDK store: JSONEncoder, small state") { benchmark in
        let encoder = JSONEncoder()
        for _ in benchmark.scaledIterations { blackHole(try! encoder.encode(smallState)) }
    }
    Benchmark("SDK store: JSONEncoder, 10 KB state") { benchmark in
        let encoder = JSONEncoder()
        for _ in benchmark.scaledIterations { blackHole(try! encoder.encode(bigState)) }
    }
    Benchmark("SDK store: JSONDecoder, 10 KB state") { benchmark in
        let data = try! JSONEncoder().encode(bigState)
        let decoder = JSONDecoder()
        for _ in benchmark.scaledIterations { blackHole(try! decoder.decode(TodoState.self, from: data)) }
    }
}
