/// What the frame decoder found in the byte stream.
public enum DecodedFrame: Equatable, Sendable {
    /// A complete frame's body (the JSON bytes, without the length prefix).
    case frame([UInt8])
    /// A frame whose length is zero (`bad-frame`); the stream stays in sync.
    case empty
    /// A frame whose announced length exceeds the limit (`too-large`); the stream cannot be trusted any more and
    /// the decoder yields nothing further.
    case tooLarge(length: UInt32)
}

/// Incremental decoder of length-prefixed frames: feed it bytes as they arrive, in chunks of any size, and pull
/// the frames out. It does no I/O. Bytes of an unfinished frame stay buffered until the rest arrives.
public struct FrameDecoder: Sendable {
    /// The largest body length accepted.
    public let maxFrame: UInt32
    private var buffer: [UInt8] = []
    private var start = 0
    private var poisoned = false

    public init(maxFrame: UInt32) {
        self.maxFrame = maxFrame
    }

    /// Bytes received but not yet part of a complete frame.
    public var bufferedByteCount: Int { buffer.count - start }

    /// Appends received bytes.
    public mutating func append<Bytes: Sequence>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        guard !poisoned else { return }
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// Appends received bytes from raw memory.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard !poisoned else { return }
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// The next complete frame, or nil when more bytes are needed.
    public mutating func next() -> DecodedFrame? {
        guard !poisoned, buffer.count - start >= 4 else { return nil }
        let length = bigEndianLength(buffer, at: start)
        if length > maxFrame {
            poisoned = true
            buffer = []
            start = 0
            return .tooLarge(length: length)
        }
        if length == 0 {
            consume(4)
            return .empty
        }
        let total = 4 + Int(length)
        guard buffer.count - start >= total else { return nil }
        let body = Array(buffer[(start + 4)..<(start + total)])
        consume(total)
        return .frame(body)
    }

    /// The next complete frame from what is buffered followed by `input[offset...]`, reading `input` in place:
    /// a frame that lies wholly in `input` is copied once, straight into its body, and only an unfinished tail is
    /// buffered (then `offset == input.count`). Advances `offset` past what it used; nil when more bytes are
    /// needed. Drain it until nil before the memory of `input` is reused (a connection's read buffer).
    public mutating func next(from input: UnsafeRawBufferPointer, at offset: inout Int) -> DecodedFrame? {
        guard !poisoned else {
            offset = input.count
            return nil
        }
        if start < buffer.count {
            // An unfinished frame is buffered: complete it from `input` (its header first, then its body).
            if let frame = next() { return frame }
            let header = min(max(4 - (buffer.count - start), 0), input.count - offset)
            appendInput(input, &offset, header)
            guard buffer.count - start >= 4 else { return nil }
            let length = bigEndianLength(buffer, at: start)
            if length <= maxFrame {
                appendInput(input, &offset, min(4 + Int(length) - (buffer.count - start), input.count - offset))
            }
            return next()
        }
        let available = input.count - offset
        guard available >= 4 else {
            appendInput(input, &offset, available)
            return nil
        }
        let length = bigEndianLength(input, at: offset)
        if length > maxFrame {
            poisoned = true
            offset = input.count
            return .tooLarge(length: length)
        }
        if length == 0 {
            offset += 4
            return .empty
        }
        let total = 4 + Int(length)
        guard available >= total else {
            appendInput(input, &offset, available)
            return nil
        }
        let body = Array(UnsafeRawBufferPointer(rebasing: input[(offset + 4)..<(offset + total)]))
        offset += total
        return .frame(body)
    }

    private mutating func appendInput(_ input: UnsafeRawBufferPointer, _ offset: inout Int, _ count: Int) {
        guard count > 0 else { return }
        buffer.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[offset..<(offset + count)]))
        offset += count
    }

    private mutating func consume(_ n: Int) {
        start += n
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        } else if start > 65_536 && start * 2 > buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
    }
}

/// The big-endian frame length at `at` (4 bytes must be there).
@inline(__always)
private func bigEndianLength<Bytes: RandomAccessCollection>(_ bytes: Bytes, at: Int) -> UInt32
where Bytes.Element == UInt8, Bytes.Index == Int {
    UInt32(bytes[at]) << 24 | UInt32(bytes[at + 1]) << 16 | UInt32(bytes[at + 2]) << 8 | UInt32(bytes[at + 3])
}
