// flux-delta-bench: the Swift SDK's own cost for a large state, before (whole states: JSONEncoder in the store,
// JSONDecoder in each subscriber) and after (SPEC §16: patches from TrackedArray logs, deltas applied to a held
// JSON tree and decoded incrementally), A/B in one run, in one process, without fluxd (what fluxd adds is measured
// by scripts/bench.sh's workload 8).
//
//     swift build -c release --product flux-delta-bench && .build/release/flux-delta-bench [--todos 10000] [--json]
//
// Workload (issue 16): the example todo store's state (TodoModel.TodoState) with N todos; each action toggles one
// todo with the example's handler (`state.toggle(id:)`, a few lines); a subscriber reads the toggled todo through
// the typed API after each change. CPU time is the thread's (CLOCK_THREAD_CPUTIME_ID).
//   store A:      copy the state, run the handler, compare (`!=`), encode the whole state (FluxJSON.encode)
//   store B:      copy the state, run the handler, JSONDeltaEncoder.change (patch bytes), commit
//   subscriber A: decode the whole snapshot's state (JSONDecoder), read the todo
//   subscriber B: scan the delta frame fluxd sends, parse its patch, apply it to the held tree, decode
//                 incrementally (JSONIncrementalDecoder), read the todo
//   whole decode: a new subscriber's first snapshot, JSONDecoder vs JSONValue parse + JSONValueDecoder

import FluxClient
import FluxCore
import FluxJSONValue
import Foundation
import TodoModel

/// main's TodoState, with `[Todo]` (the "before" model).
struct PlainTodoState: Codable, Equatable, Sendable {
    var todos: [Todo]
    var nextID: Int

    mutating func toggle(id: Int) -> Bool {
        guard let i = todos.firstIndex(where: { $0.id == id }) else { return false }
        todos[i].done.toggle()
        return todos[i].done
    }
}

func cpuNow() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// Runs `body` `n` times; CPU µs per run.
func measure(_ n: Int, _ body: (Int) throws -> Void) rethrows -> Double {
    let start = cpuNow()
    for i in 0..<n { try body(i) }
    return (cpuNow() - start) / Double(n) * 1e6
}

var todoCount = 10_000
var json = false
var args = CommandLine.arguments.dropFirst()
while let a = args.popFirst() {
    switch a {
    case "--todos": todoCount = Int(args.popFirst() ?? "") ?? todoCount
    case "--json": json = true
    default:
        print("usage: flux-delta-bench [--todos N] [--json]")
        exit(2)
    }
}

var tracked = TodoState()
for i in 1...todoCount { _ = try tracked.create(title: "todo number \(i)", seq: i) }
var plain = PlainTodoState(todos: Array(tracked.todos), nextID: tracked.nextID)
let snapshotBytes = try FluxJSON.encode(plain)
let ids = (0..<4096).map { _ in Int.random(in: 1...todoCount) }

// Store A: whole states.
var stateBytesA = 0
let storeA = try measure(40) { i in
    var copy = plain
    _ = copy.toggle(id: ids[i % ids.count])
    if copy != plain {
        let bytes = try FluxJSON.encode(copy)
        stateBytesA = bytes.count
        plain = copy
    }
}

// Store B: patches.
var delta = JSONDeltaEncoder()
try delta.setBaseline(tracked)
var patches: [[UInt8]] = []
var storeSplit = [0.0, 0.0, 0.0]
let storeB = try measure(4000) { i in
    let t0 = cpuNow()
    var copy = tracked
    _ = try copy.toggle(id: ids[i % ids.count])
    let t1 = cpuNow()
    guard let change = try delta.change(to: copy), !change.isEmpty else { return }
    let t2 = cpuNow()
    let bytes = change.bytes
    delta.commit(change)
    tracked = copy
    if patches.count < 4096 { patches.append(bytes) }
    let t3 = cpuNow()
    storeSplit[0] += t1 - t0; storeSplit[1] += t2 - t1; storeSplit[2] += t3 - t2
}
if ProcessInfo.processInfo.environment["SPLIT"] != nil {
    print("store B split (µs): handler \(storeSplit[0] / 4000 * 1e6), change \(storeSplit[1] / 4000 * 1e6), bytes+commit \(storeSplit[2] / 4000 * 1e6)")
}

// Subscriber A: the whole snapshot frame, decoded.
var b = FrameBuilder(op: "snapshot", capacity: snapshotBytes.count + 64)
b.string("store", "todos")
b.int("version", 2)
b.int("seq", 2)
b.raw("state", snapshotBytes)
let snapshotFrame = b.finish().bodyArray
var sink = 0
let subscriberA = try measure(20) { i in
    let env = try Envelope(body: snapshotFrame)
    let state = try JSONDecoder().decode(PlainTodoState.self, from: Data(env.raw("state")!))
    if state.todos[ids[i % ids.count] - 1].done { sink += 1 }
}

// Subscriber B: delta frames (the patches store B made, in order), applied and decoded incrementally.
var frames: [[UInt8]] = []
var deltaFrameBytes = 0
for (n, patch) in patches.enumerated() {
    var f = FrameBuilder(op: "delta", capacity: patch.count + 96)
    f.string("store", "todos")
    f.int("from", n + 1)
    f.int("version", n + 2)
    f.int("seq", n + 2)
    f.raw("patch", patch)
    let body = f.finish().bodyArray
    deltaFrameBytes += body.count
    frames.append(body)
}
var start = TodoState()
for i in 1...todoCount { _ = try start.create(title: "todo number \(i)", seq: i) }
var tree = try JSONValue(parsing: try FluxJSON.encode(start))
let incremental = JSONIncrementalDecoder<TodoState>()
var typed = try incremental.decode(tree)
var split = [0.0, 0.0, 0.0]
let subscriberB = try measure(frames.count) { i in
    let t0 = cpuNow()
    let env = try Envelope(body: frames[i])
    let patch = try JSONPatch(parsing: env.raw("patch")!)
    let t1 = cpuNow()
    try tree.apply(patch)
    let t2 = cpuNow()
    if ProcessInfo.processInfo.environment["NODECODE"] == nil { typed = try incremental.decode(tree, after: patch.touches) }
    if typed.todos[ids[i % ids.count] - 1].done { sink += 1 }
    let t3 = cpuNow()
    split[0] += t1 - t0; split[1] += t2 - t1; split[2] += t3 - t2
}
if ProcessInfo.processInfo.environment["SPLIT"] != nil {
    print("subscriber B split (µs): scan+parse \(split[0] / Double(frames.count) * 1e6), apply \(split[1] / Double(frames.count) * 1e6), decode \(split[2] / Double(frames.count) * 1e6)")
}
let consistent = typed == tracked

// Whole decode (a new subscriber, or a resync).
let wholeFoundation = try measure(10) { _ in
    _ = try JSONDecoder().decode(TodoState.self, from: Data(snapshotBytes))
}
let wholeValue = try measure(10) { _ in
    _ = try JSONIncrementalDecoder<TodoState>().decode(try JSONValue(parsing: snapshotBytes))
}

let results: [(String, Double)] = [
    ("store_cpu_us_per_action_before", storeA), ("store_cpu_us_per_action_after", storeB),
    ("subscriber_cpu_us_per_change_before", subscriberA), ("subscriber_cpu_us_per_change_after", subscriberB),
    ("bytes_per_change_before", Double(snapshotFrame.count)),
    ("bytes_per_change_after", Double(deltaFrameBytes) / Double(max(1, frames.count))),
    ("whole_decode_us_jsondecoder", wholeFoundation), ("whole_decode_us_jsonvalue", wholeValue),
]
if json {
    print("{" + (results.map { "\"\($0.0)\":\(($0.1 * 10).rounded() / 10)" } + ["\"todos\":\(todoCount)", "\"consistent\":\(consistent)"]).joined(separator: ",") + "}")
} else {
    print("flux-delta-bench: \(todoCount) todos, state \(stateBytesA) bytes; toggling one todo per action; CPU per operation (thread time)")
    for (name, value) in results { print(String(format: "  %-40@ %12.1f", name as NSString, value)) }
    print("  subscriber state equals the store's: \(consistent) (\(sink) reads)")
}
if !consistent { exit(1) }
