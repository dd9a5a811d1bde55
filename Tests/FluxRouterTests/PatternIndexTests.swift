import FluxCore
@testable import FluxRouter
import Testing

/// The pattern index that routes a type not cached (issue 25: the work is bounded by the type, not by the number of
/// patterns on the bus), checked against matching every pattern (`Names.matches`) on random registrations,
/// re-registrations and types.
@Suite("Pattern index")
struct PatternIndexTests {
    @Test("PatternIndex.matching finds exactly the stores a scan of every pattern finds (random patterns, changes and types)")
    func differential() {
        var rng = SystemRandomNumberGenerator()
        let alphabet = ["a", "b", "/", "ab", "é"]
        func word(_ max: Int) -> String { (0..<Int.random(in: 0...max, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined() }
        var index = PatternIndex()
        var stores: [(StoreEntry, [String])] = []
        for i in 0..<60 {
            let patterns = (0..<Int.random(in: 0...4, using: &rng)).map { _ in Bool.random(using: &rng) ? word(4) + "*" : word(4) }
            let store = StoreEntry(name: "s\(i)", key: UInt32(i))
            index.add(store, patterns)
            stores.append((store, patterns))
        }
        for round in 0..<400 {
            if round % 5 == 0 {  // a re-registration with other patterns
                let k = Int.random(in: 0..<stores.count, using: &rng)
                let new = (0..<Int.random(in: 0...3, using: &rng)).map { _ in Bool.random(using: &rng) ? word(3) + "*" : word(3) }
                index.remove(stores[k].0, stores[k].1)
                index.add(stores[k].0, new)
                stores[k].1 = new
            }
            let type = word(6)
            let expected = stores.filter { s in s.1.contains { Names.matches(pattern: $0, type: type) } }.map(\.0.name).sorted()
            #expect(index.matching(type).map(\.name) == expected, "type \(type)")
        }
    }
}
