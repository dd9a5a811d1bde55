import CFluxSys

/// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected as 0x82F63B78), the checksum of every journal record: the
/// one iSCSI, ext4 and LevelDB use for the same job. Computed by `cfluxsys_crc32c` (the CPU's crc32 instruction
/// where there is one, slicing-by-8 tables otherwise: the Swift tables below cost ~6 instructions a byte, a third
/// of a durable fluxd's journaling); guarded by FluxJournalTests against RFC 3720's test vectors and a bit-by-bit
/// reference on random inputs, through both paths.
public enum CRC32C {
    static let tables: [[UInt32]] = {
        var tables = [[UInt32]](repeating: [UInt32](repeating: 0, count: 256), count: 8)
        for i in 0..<256 {
            var c = UInt32(i)
            for _ in 0..<8 { c = c & 1 != 0 ? (c >> 1) ^ 0x82F6_3B78 : c >> 1 }
            tables[0][i] = c
        }
        for i in 0..<256 {
            for t in 1..<8 {
                let previous = tables[t - 1][i]
                tables[t][i] = (previous >> 8) ^ tables[0][Int(previous & 0xFF)]
            }
        }
        return tables
    }()

    /// The checksum of `bytes`, continuing from `crc` (the checksum of what came before; 0 to start).
    public static func checksum<Bytes: Collection>(_ bytes: Bytes, continuing crc: UInt32 = 0) -> UInt32
        where Bytes.Element == UInt8
    {
        if let done = bytes.withContiguousStorageIfAvailable({ buffer -> UInt32 in
            cfluxsys_crc32c(crc, buffer.baseAddress, buffer.count)
        }) {
            return done
        }
        return software(bytes, continuing: crc)
    }

    /// The same, in Swift (the reference the C path is tested against, and the path for non-contiguous bytes).
    public static func software<Bytes: Collection>(_ bytes: Bytes, continuing crc: UInt32 = 0) -> UInt32
        where Bytes.Element == UInt8
    {
        var c = ~crc
        let t = tables
        if let done = bytes.withContiguousStorageIfAvailable({ buffer -> UInt32 in
            var c = c
            var i = 0
            let n = buffer.count
            while i + 8 <= n {
                let lo = c ^ (UInt32(buffer[i]) | UInt32(buffer[i + 1]) << 8 | UInt32(buffer[i + 2]) << 16 | UInt32(buffer[i + 3]) << 24)
                c = t[7][Int(lo & 0xFF)] ^ t[6][Int((lo >> 8) & 0xFF)] ^ t[5][Int((lo >> 16) & 0xFF)] ^ t[4][Int(lo >> 24)]
                    ^ t[3][Int(buffer[i + 4])] ^ t[2][Int(buffer[i + 5])] ^ t[1][Int(buffer[i + 6])] ^ t[0][Int(buffer[i + 7])]
                i += 8
            }
            while i < n {
                c = t[0][Int((c ^ UInt32(buffer[i])) & 0xFF)] ^ (c >> 8)
                i += 1
            }
            return c
        }) {
            return ~done
        }
        for b in bytes { c = t[0][Int((c ^ UInt32(b)) & 0xFF)] ^ (c >> 8) }
        return ~c
    }
}
