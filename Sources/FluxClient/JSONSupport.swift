import FluxCore
import Foundation

/// Foundation JSON for user types, set up the way the protocol needs it.
///
/// States, payloads and queries are encoded with sorted keys so that equal values always give equal bytes (fluxd
/// deduplicates queries and recognizes unchanged states by byte equality).
public enum FluxJSON {
    /// Encodes `value` as compact JSON with sorted keys.
    public static func encode<T: Encodable>(_ value: T) throws(FluxError) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        do {
            return Array(try encoder.encode(value))
        } catch {
            throw .coding("cannot encode \(T.self): \(error)")
        }
    }

    /// Decodes `T` from JSON bytes.
    public static func decode<T: Decodable, Bytes: Collection>(_ type: T.Type, from bytes: Bytes) throws(FluxError) -> T
    where Bytes.Element == UInt8 {
        do {
            return try JSONDecoder().decode(T.self, from: Data(bytes))
        } catch {
            throw .coding("cannot decode \(T.self): \(error)")
        }
    }

    /// Checks that `bytes` hold exactly one valid JSON value (used before splicing caller-supplied raw JSON).
    public static func validate(_ bytes: [UInt8]) throws(FluxError) {
        var wrapped: [UInt8] = Array("{\"v\":".utf8)
        wrapped.append(contentsOf: bytes)
        wrapped.append(UInt8(ascii: "}"))
        do {
            _ = try Envelope(body: wrapped)
        } catch {
            throw .invalidArgument("not a single JSON value: \(error.message)")
        }
    }
}

extension Envelope {
    /// An integer field as `Int`.
    package func fluxInt(_ key: String) -> Int? {
        int(key).value.map { Int($0) }
    }

    /// A string field.
    package func fluxString(_ key: String) -> String? {
        string(key).value
    }
}

/// Builds `{"code":...,"message":...}`.
package func errorObjectJSON(code: String, message: String) -> [UInt8] {
    var out: [UInt8] = Array("{\"code\":".utf8)
    appendEscaped(code, to: &out)
    out.append(contentsOf: Array(",\"message\":".utf8))
    appendEscaped(message, to: &out)
    out.append(UInt8(ascii: "}"))
    return out
}

/// Reads an `error` object field (`{"code":..,"message":..}`) of an envelope.
package func errorObject(in env: Envelope, key: String) -> (code: String, message: String)? {
    guard let raw = env.raw(key), let inner = try? Envelope(body: Array(raw)) else { return nil }
    return (inner.fluxString("code") ?? "", inner.fluxString("message") ?? "")
}
