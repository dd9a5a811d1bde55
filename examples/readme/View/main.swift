import FluxClient

struct Counter: Codable, Sendable { var value = 0 }

do {
    let client = try await FluxClient.connect(name: "counter-view")
    let settlement = try await client.dispatchAndSettle(type: "counter/add", payload: ["by": 2])
    print("counter/add: seq \(settlement.seq)")
    for try await snapshot in client.subscribe(store: "counter", as: Counter.self).snapshots {
        print("v\(snapshot.version): \(snapshot.state.value)")
    }
} catch {
    print("counter-view: \(error)")                // e.g. no fluxd at PATH (from the default path): ... what to do
}
