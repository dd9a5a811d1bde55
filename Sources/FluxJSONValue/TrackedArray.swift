// A change-tracked array for large states (SPEC §16): a value type that encodes and decodes as a plain JSON array
// (so a model stays Codable and wire-compatible), whose copies are cheap to change (elements live in chunks: a copy
// that changes one element copies one chunk, not the array), and that keeps, inside the value, a bounded log of its
// recent changes. `JSONDeltaEncoder` reads that log to describe a change as element-level patch operations without
// encoding the whole array, and `JSONValueDecoder` uses it the other way round to decode only the elements a patch
// touched.

import Synchronization

/// Stamps of tracked values: every change of every `TrackedArray` in the process gets the next one, so a stamp names
/// one content (copies share it until one of them changes) and a history that forked gets different stamps.
private let trackedStamps = Atomic<UInt64>(0)

@inline(__always)
func nextTrackedStamp() -> UInt64 {
    trackedStamps.wrappingAdd(1, ordering: .relaxed).newValue
}

/// One logged change of a `TrackedArray`, with the element as it was right after the change.
@usableFromInline
struct TrackedChange<Element> {
    @usableFromInline
    enum Kind {
        case set(Int, Element)
        case insert(Int, Element)
        case remove(Int)
    }
    var stamp: UInt64
    var kind: Kind
}

/// The recent changes of a `TrackedArray`: `base` names the content before the first entry; each entry's stamp names
/// the content after it. Bounded: the oldest entries are dropped (then `base` moves on).
@usableFromInline
struct TrackedLog<Element> {
    var base: UInt64
    var entries: [TrackedChange<Element>] = []

    /// Kept entries: at most `2 * keep`, trimmed to `keep`.
    static var keep: Int { 128 }

    init() { base = nextTrackedStamp() }

    var stamp: UInt64 { entries.last?.stamp ?? base }

    @usableFromInline
    mutating func append(_ kind: TrackedChange<Element>.Kind) {
        if entries.count >= 2 * Self.keep {
            base = entries[Self.keep - 1].stamp
            entries.removeFirst(Self.keep)
        }
        entries.append(TrackedChange(stamp: nextTrackedStamp(), kind: kind))
    }

    /// Forgets the history: the content is new (an encoder that saw an older one sends it whole).
    mutating func reset() {
        base = nextTrackedStamp()
        entries = []
    }

    /// The changes after the content named `stamp`, in order; nil when this log does not reach back to it.
    func changes(since stamp: UInt64) -> ArraySlice<TrackedChange<Element>>? {
        if stamp == base { return entries[...] }
        // Stamps grow along one history: binary search.
        var lo = 0, hi = entries.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if entries[mid].stamp < stamp { lo = mid + 1 } else { hi = mid }
        }
        guard lo < entries.count, entries[lo].stamp == stamp else { return nil }
        return entries[(lo + 1)...]
    }
}

/// An array for the large collections of a store's state: use it where a model would use `[Element]`
/// (`var todos: TrackedArray<Todo>`). It encodes and decodes as a JSON array, exactly like `[Element]`, and is a
/// `RandomAccessCollection`, `MutableCollection` and `RangeReplaceableCollection` with `Int` indices from 0.
///
/// What it adds: a store (`FluxStore`) publishes a change to it as element-level JSON Patch operations (SPEC §16:
/// `replace /todos/3`, `add /todos/10000`, `remove /todos/2`) instead of encoding the whole state, and a client
/// decodes only the elements a patch touched, reusing the others. For that it keeps, inside the value, a bounded
/// log of its recent changes (with the changed elements), and stores its elements in chunks so that changing one
/// element of a copy copies one chunk. A handler that changes many elements at once (more than about a hundred) is
/// published as the whole array instead.
///
/// It has value semantics like `Array`; two arrays are equal when their elements are.
public struct TrackedArray<Element> {
    /// Elements per chunk while the array only grows at its end (chunks are split at twice this when elements are
    /// inserted in the middle).
    @usableFromInline static var chunkSize: Int { 64 }

    @usableFromInline var chunks: [[Element]] = []
    /// `starts[k]`: the index of the first element of `chunks[k]`.
    @usableFromInline var starts: [Int] = []
    @usableFromInline var total = 0
    /// Whether every chunk but the last holds exactly `chunkSize` elements (index arithmetic instead of a search).
    @usableFromInline var uniform = true
    @usableFromInline var log = TrackedLog<Element>()

    /// An empty array.
    public init() {}

    /// An array of these elements.
    public init<S: Sequence>(_ elements: S) where S.Element == Element {
        self.init()
        appendWithoutLogging(contentsOf: elements)
    }

    /// The elements as an `Array`.
    public var array: [Element] {
        var out: [Element] = []
        out.reserveCapacity(total)
        for c in chunks { out.append(contentsOf: c) }
        return out
    }

    /// The stamp naming this content (changes with every mutation; equal for copies).
    var stamp: UInt64 { log.stamp }

    // MARK: Chunks

    @inlinable @inline(__always)
    func locate(_ i: Int) -> (chunk: Int, offset: Int) {
        precondition(i >= 0 && i < total, "TrackedArray index \(i) out of range (count \(total))")
        if uniform { return (i / Self.chunkSize, i % Self.chunkSize) }
        var lo = 0, hi = starts.count - 1
        while lo < hi {
            let mid = (lo + hi + 1) / 2
            if starts[mid] <= i { lo = mid } else { hi = mid - 1 }
        }
        return (lo, i - starts[lo])
    }

    mutating func appendWithoutLogging<S: Sequence>(contentsOf elements: S) where S.Element == Element {
        for e in elements { appendOne(e) }
    }

    @inline(__always)
    mutating func appendOne(_ e: Element) {
        if let last = chunks.indices.last, chunks[last].count < Self.chunkSize {
            chunks[last].append(e)
        } else {
            if let last = chunks.indices.last, chunks[last].count != Self.chunkSize { uniform = false }
            var c: [Element] = []
            c.reserveCapacity(Self.chunkSize)
            c.append(e)
            chunks.append(c)
            starts.append(total)
        }
        total += 1
    }

    /// Lays the elements out again in full chunks (after many insertions or removals in the middle).
    mutating func rechunk() {
        let all = array
        chunks = []
        starts = []
        total = 0
        uniform = true
        appendWithoutLogging(contentsOf: all)
    }

    mutating func insertWithoutLogging(_ e: Element, at i: Int) {
        precondition(i >= 0 && i <= total, "TrackedArray insertion index \(i) out of range (count \(total))")
        if i == total {
            appendOne(e)
            return
        }
        let (k, offset) = locate(i)
        chunks[k].insert(e, at: offset)
        for j in (k + 1)..<starts.count { starts[j] += 1 }
        total += 1
        uniform = false
        if chunks[k].count > 2 * Self.chunkSize {
            let tail = Array(chunks[k][Self.chunkSize...])
            chunks[k].removeSubrange(Self.chunkSize...)
            chunks.insert(tail, at: k + 1)
            starts.insert(starts[k] + Self.chunkSize, at: k + 1)
        }
    }

    mutating func removeWithoutLogging(at i: Int) -> Element {
        let (k, offset) = locate(i)
        let removed = chunks[k].remove(at: offset)
        total -= 1
        if k != chunks.count - 1 { uniform = false }
        if chunks[k].isEmpty {
            chunks.remove(at: k)
            starts.remove(at: k)
            for j in k..<starts.count { starts[j] -= 1 }
        } else {
            for j in (k + 1)..<starts.count { starts[j] -= 1 }
        }
        if !uniform && chunks.count > total / (Self.chunkSize / 4) + 8 { rechunk() }
        return removed
    }
}

extension TrackedArray: RandomAccessCollection, MutableCollection {
    public typealias Index = Int
    public typealias Indices = Range<Int>

    @inlinable public var startIndex: Int { 0 }
    @inlinable public var endIndex: Int { total }
    @inlinable public var count: Int { total }
    @inlinable public var isEmpty: Bool { total == 0 }
    @inlinable public var indices: Range<Int> { 0..<total }
    @inlinable public func index(after i: Int) -> Int { i + 1 }
    @inlinable public func index(before i: Int) -> Int { i - 1 }

    /// The element at `index`; setting it (or changing it in place) is logged as one change.
    @inlinable
    public subscript(index: Int) -> Element {
        get {
            let (k, o) = locate(index)
            return chunks[k][o]
        }
        set {
            let (k, o) = locate(index)
            chunks[k][o] = newValue
            log.append(.set(index, newValue))
        }
        _modify {
            let (k, o) = locate(index)
            defer { log.append(.set(index, chunks[k][o])) }
            yield &chunks[k][o]
        }
    }

    public subscript(bounds: Range<Int>) -> Slice<TrackedArray<Element>> {
        get { Slice(base: self, bounds: bounds) }
        set {
            precondition(newValue.count == bounds.count, "a slice assignment must keep the count")
            for (i, e) in zip(bounds, newValue) { self[i] = e }
        }
    }

    @inlinable
    public func makeIterator() -> Iterator { Iterator(chunks: chunks) }

    /// Walks the chunks in order.
    public struct Iterator: IteratorProtocol {
        @usableFromInline let chunks: [[Element]]
        @usableFromInline var chunk = 0
        @usableFromInline var offset = 0

        @inlinable
        init(chunks: [[Element]]) { self.chunks = chunks }

        @inlinable
        public mutating func next() -> Element? {
            while chunk < chunks.count {
                if offset < chunks[chunk].count {
                    defer { offset += 1 }
                    return chunks[chunk][offset]
                }
                chunk += 1
                offset = 0
            }
            return nil
        }
    }

    /// The index of the first element that satisfies `predicate` (walking the chunks, without an index search per
    /// element).
    @inlinable
    public func firstIndex(where predicate: (Element) throws -> Bool) rethrows -> Int? {
        var base = 0
        for c in chunks {
            if let o = try c.firstIndex(where: predicate) { return base + o }
            base += c.count
        }
        return nil
    }

    /// The index of the last element that satisfies `predicate`.
    @inlinable
    public func lastIndex(where predicate: (Element) throws -> Bool) rethrows -> Int? {
        var end = total
        for c in chunks.reversed() {
            end -= c.count
            if let o = try c.lastIndex(where: predicate) { return end + o }
        }
        return nil
    }

    /// The first element that satisfies `predicate`.
    @inlinable
    public func first(where predicate: (Element) throws -> Bool) rethrows -> Element? {
        for c in chunks { if let e = try c.first(where: predicate) { return e } }
        return nil
    }

    /// Whether an element satisfies `predicate`.
    @inlinable
    public func contains(where predicate: (Element) throws -> Bool) rethrows -> Bool {
        for c in chunks where try c.contains(where: predicate) { return true }
        return false
    }

    /// How many elements satisfy `predicate`.
    @inlinable
    public func count(where predicate: (Element) throws -> Bool) rethrows -> Int {
        var n = 0
        for c in chunks { for e in c where try predicate(e) { n += 1 } }
        return n
    }

    /// Calls `body` on each element in order.
    @inlinable
    public func forEach(_ body: (Element) throws -> Void) rethrows {
        for c in chunks { for e in c { try body(e) } }
    }
}

extension TrackedArray: RangeReplaceableCollection {
    /// Appends an element (logged as an insertion at the end).
    public mutating func append(_ newElement: Element) {
        let i = total
        appendOne(newElement)
        log.append(.insert(i, newElement))
    }

    /// Appends elements (each logged as an insertion; many at once are published as the whole array).
    public mutating func append<S: Sequence>(contentsOf newElements: S) where S.Element == Element {
        for e in newElements { append(e) }
    }

    /// Inserts an element at `i` (logged).
    public mutating func insert(_ newElement: Element, at i: Int) {
        insertWithoutLogging(newElement, at: i)
        log.append(.insert(i, newElement))
    }

    /// Removes and returns the element at `i` (logged).
    @discardableResult
    public mutating func remove(at i: Int) -> Element {
        let e = removeWithoutLogging(at: i)
        log.append(.remove(i))
        return e
    }

    /// Removes and returns the last element.
    @discardableResult
    public mutating func removeLast() -> Element {
        precondition(total > 0, "removeLast on an empty TrackedArray")
        return remove(at: total - 1)
    }

    /// Removes and returns the first element.
    @discardableResult
    public mutating func removeFirst() -> Element {
        precondition(total > 0, "removeFirst on an empty TrackedArray")
        return remove(at: 0)
    }

    /// Removes every element (published as a new, empty array).
    public mutating func removeAll(keepingCapacity keepCapacity: Bool = false) {
        chunks = []
        starts = []
        total = 0
        uniform = true
        log.reset()
    }

    /// Removes the elements that satisfy `shouldBeRemoved` (each logged as a removal, from the end).
    public mutating func removeAll(where shouldBeRemoved: (Element) throws -> Bool) rethrows {
        var doomed: [Int] = []
        var base = 0
        for c in chunks {
            for (o, e) in c.enumerated() where try shouldBeRemoved(e) { doomed.append(base + o) }
            base += c.count
        }
        if doomed.count > TrackedLog<Element>.keep {
            var kept: [Element] = []
            kept.reserveCapacity(total - doomed.count)
            var next = 0
            for (i, e) in self.enumerated() {
                if next < doomed.count && doomed[next] == i { next += 1 } else { kept.append(e) }
            }
            replaceAllWithoutHistory(kept)
            return
        }
        for i in doomed.reversed() { remove(at: i) }
    }

    /// Replaces `subrange` by `newElements`: removals and insertions, each logged (a large replacement is published
    /// as the whole array).
    public mutating func replaceSubrange<C: Collection>(_ subrange: Range<Int>, with newElements: C)
    where C.Element == Element {
        precondition(subrange.lowerBound >= 0 && subrange.upperBound <= total, "TrackedArray range out of bounds")
        if subrange.count + newElements.count > TrackedLog<Element>.keep {
            var all = array
            all.replaceSubrange(subrange, with: newElements)
            replaceAllWithoutHistory(all)
            return
        }
        for i in subrange.reversed() { remove(at: i) }
        var at = subrange.lowerBound
        for e in newElements {
            insert(e, at: at)
            at += 1
        }
    }

    /// Reserves nothing (chunks grow as needed); present for `RangeReplaceableCollection`.
    public mutating func reserveCapacity(_ n: Int) {}

    mutating func replaceAllWithoutHistory(_ elements: [Element]) {
        chunks = []
        starts = []
        total = 0
        uniform = true
        appendWithoutLogging(contentsOf: elements)
        log.reset()
    }
}

extension TrackedArray: ExpressibleByArrayLiteral {
    public init(arrayLiteral elements: Element...) {
        self.init(elements)
    }
}

extension TrackedArray: Equatable where Element: Equatable {
    public static func == (a: TrackedArray, b: TrackedArray) -> Bool {
        if a.stamp == b.stamp { return true }  // One content (copies of one value).
        guard a.total == b.total else { return false }
        if a.starts == b.starts {
            // Same layout: chunk by chunk (an unchanged chunk shares its storage: compared by identity).
            for (x, y) in zip(a.chunks, b.chunks) where x != y { return false }
            return true
        }
        return a.elementsEqual(b)
    }
}

extension TrackedArray: Hashable where Element: Hashable {
    public func hash(into hasher: inout Hasher) {
        hasher.combine(total)
        for e in self { hasher.combine(e) }
    }
}

extension TrackedArray: Sendable where Element: Sendable {}
extension TrackedLog: Sendable where Element: Sendable {}
extension TrackedChange: Sendable where Element: Sendable {}
extension TrackedChange.Kind: Sendable where Element: Sendable {}

extension TrackedArray: CustomStringConvertible, CustomDebugStringConvertible {
    public var description: String { array.description }
    public var debugDescription: String { "TrackedArray(\(array.debugDescription))" }
}

extension TrackedArray: Encodable where Element: Encodable {
    /// Encodes as a JSON array of the elements (for `JSONDeltaEncoder`: as a tracked node it can describe by its log).
    public func encode(to encoder: any Encoder) throws {
        if let walker = encoder as? ValueWalker, walker.tracking {
            walker.recordTracked(self)
            return
        }
        var c = encoder.unkeyedContainer()
        for chunk in chunks { for e in chunk { try c.encode(e) } }
    }
}

extension TrackedArray: Decodable where Element: Decodable {
    /// Decodes from a JSON array (with `JSONValueDecoder` and an earlier value to start from: only the elements a
    /// patch touched).
    public init(from decoder: any Decoder) throws {
        if let reader = decoder as? ValueReader, let reused = try reader.decodeTracked(Self.self) {
            self = reused
            return
        }
        var c = try decoder.unkeyedContainer()
        self.init()
        while !c.isAtEnd { appendOne(try c.decode(Element.self)) }
        if let reader = decoder as? ValueReader { reader.noteTracked(self) }
    }
}
