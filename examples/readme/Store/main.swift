import FluxStore

struct Counter: Codable, Equatable, Sendable { var value = 0 }
struct Add: Codable, Sendable { var by: Int }

let store = FluxStore<Counter>(name: "counter", initial: Counter(), handles: ["counter/*"])
store.on("counter/add", as: Add.self) { state, action, ctx in
    guard action.by > 0 else { throw StoreRejection(code: "counter/bad-step", message: "step must be positive") }
    state.value += action.by                       // a transaction: rolled back if the handler throws
}
do {
    try await store.run()                          // register, resume from the retained state, serve actions
} catch {
    print("counter-store: \(error)")               // e.g. no fluxd at PATH (from the default path): ... what to do
}
