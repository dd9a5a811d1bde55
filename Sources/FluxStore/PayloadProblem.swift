import FluxClient
import FluxJSONValue
import Foundation

/// Turns decoding failures and handler errors into text for the person who dispatched the action: which field,
/// what was expected and what was found (`field 'done': expected a boolean, found a string`), never Swift's
/// `DecodingError ... CodingKeys(stringValue: ...)` debug text.
enum PayloadProblem {
    /// Why `payload` did not decode (the store prefixes `payload of TYPE: `).
    static func describe(_ error: any Error, payload: ArraySlice<UInt8>) -> String {
        guard let error = error as? DecodingError else { return readable(error) }
        let value = try? JSONValue(parsing: payload)
        switch error {
        case .keyNotFound(let key, let context):
            return "field '\(path(context.codingPath + [key]))' is missing"
        case .valueNotFound(let type, let context):
            let found = value.flatMap { lookUp(context.codingPath, in: $0) }.map(kind) ?? "null"
            return "\(subject(context.codingPath))expected \(name(of: type)), found \(found)"
        case .typeMismatch(let type, let context):
            let found = value.flatMap { lookUp(context.codingPath, in: $0) }
            return "\(subject(context.codingPath))expected \(name(of: type)), found \(found.map(kind) ?? "something else")"
                + (found.map { v in isNumber(v) && name(of: type) == "a whole number" ? " (\(v.compact))" : "" } ?? "")
        case .dataCorrupted(let context):
            if context.codingPath.isEmpty, value == nil { return "not valid JSON" }
            // Foundation: "Parsed JSON number <1.5> does not fit in Int." (sometimes without the field's path).
            let text = context.debugDescription
            if let open = text.firstIndex(of: "<"), let close = text.firstIndex(of: ">"), open < close,
               let fit = text.range(of: "does not fit in ") {
                let number = String(text[text.index(after: open)..<close])
                let target = String(text[fit.upperBound...].prefix { $0 != "." })
                let expected = ["Int", "Int8", "Int16", "Int32", "Int64", "UInt", "UInt8", "UInt16", "UInt32", "UInt64"]
                    .contains(target) ? "a whole number that fits in \(target)" : "a \(target)"
                var keys = context.codingPath
                if keys.isEmpty, let value, let only = paths(of: .number(number), in: value), only.count == 1 { keys = only[0] }
                return "\(subject(keys))expected \(expected), found \(number)"
            }
            if context.codingPath.isEmpty, let value {
                // swift-corelibs-foundation reports a fraction given for an integer field as invalid JSON, with no
                // path: name the one number that is not a whole number, if there is one.
                let fractions = numbers(in: value).filter { !$0.text.allSatisfy { $0.isNumber || $0 == "-" } }
                if fractions.count == 1 {
                    return "\(subject(fractions[0].path))expected a whole number, found \(fractions[0].text)"
                }
            }
            let found = value.flatMap { lookUp(context.codingPath, in: $0) }
            if let found, case .string(let text) = found {
                return "\(subject(context.codingPath))'\(text)' is not an accepted value"
            }
            if let found, isNumber(found) {
                return "\(subject(context.codingPath))\(found.compact) does not fit"
            }
            return "\(subject(context.codingPath))not an accepted value"
        @unknown default:
            return "does not decode"
        }
    }

    /// An error thrown by a handler (other than `StoreRejection`), as a message.
    static func readable(_ error: any Error) -> String {
        if let error = error as? DecodingError { return "a value does not decode: " + describe(error, payload: []) }
        if let error = error as? FluxError { return error.description }
        if let error = error as? LocalizedError, let text = error.errorDescription { return text }
        let text = String(describing: error)
        let type = String(describing: Swift.type(of: error))
        // A bare type name (`Boom()`) says little: name the type at least.
        return text == type + "()" || text == type ? "the handler failed (\(type))" : text
    }

    /// `title`, `items[2].done`.
    private static func path(_ keys: [any CodingKey]) -> String {
        var out = ""
        for key in keys {
            if let index = key.intValue {
                out += "[\(index)]"
            } else {
                if !out.isEmpty { out += "." }
                out += key.stringValue
            }
        }
        return out
    }

    /// `field 'x': ` (nothing for the payload as a whole).
    private static func subject(_ keys: [any CodingKey]) -> String {
        keys.isEmpty ? "" : "field '\(path(keys))': "
    }

    private static func lookUp(_ keys: [any CodingKey], in root: JSONValue) -> JSONValue? {
        var current = root
        for key in keys {
            if let index = key.intValue, case .array = current {
                guard let next = current[index] else { return nil }
                current = next
            } else {
                guard let next = current[key.stringValue] else { return nil }
                current = next
            }
        }
        return current
    }

    /// Every number in `root`, with its path.
    private static func numbers(in root: JSONValue) -> [(path: [any CodingKey], text: String)] {
        var found: [(path: [any CodingKey], text: String)] = []
        func walk(_ v: JSONValue, _ at: [any CodingKey]) {
            switch v {
            case .number(let text): found.append((at, text))
            case .array(let items): for (i, item) in items.enumerated() { walk(item, at + [PathKey(intValue: i)]) }
            case .object(let members): for m in members { walk(m.value, at + [PathKey(stringValue: m.key)]) }
            default: break
            }
        }
        walk(root, [])
        return found
    }

    /// The paths at which `wanted` occurs in `root`.
    private static func paths(of wanted: JSONValue, in root: JSONValue) -> [[any CodingKey]]? {
        var found: [[any CodingKey]] = []
        func walk(_ v: JSONValue, _ at: [any CodingKey]) {
            if v == wanted { found.append(at) }
            switch v {
            case .array(let items): for (i, item) in items.enumerated() { walk(item, at + [PathKey(intValue: i)]) }
            case .object(let members): for m in members { walk(m.value, at + [PathKey(stringValue: m.key)]) }
            default: break
            }
        }
        walk(root, [])
        return found
    }

    private struct PathKey: CodingKey {
        var stringValue: String
        var intValue: Int?
        init(stringValue: String) { self.stringValue = stringValue }
        init(intValue: Int) {
            self.stringValue = String(intValue)
            self.intValue = intValue
        }
    }

    private static func isNumber(_ v: JSONValue) -> Bool {
        if case .number = v { return true }
        return false
    }

    private static func kind(_ v: JSONValue) -> String {
        switch v {
        case .null: return "null"
        case .bool: return "a boolean"
        case .number: return "a number"
        case .string: return "a string"
        case .array: return "an array"
        case .object: return "an object"
        }
    }

    private static func name(of type: Any.Type) -> String {
        switch type {
        case is Bool.Type: return "a boolean"
        case is String.Type, is Character.Type: return "a string"
        case is Int.Type, is Int8.Type, is Int16.Type, is Int32.Type, is Int64.Type,
             is UInt.Type, is UInt8.Type, is UInt16.Type, is UInt32.Type, is UInt64.Type:
            return "a whole number"
        case is Double.Type, is Float.Type, is Decimal.Type: return "a number"
        default:
            let text = String(describing: type)
            if text.hasPrefix("Array<") || text.hasPrefix("[") || text.contains("UnkeyedDecodingContainer") { return "an array" }
            if text.hasPrefix("Dictionary<") || text.contains("KeyedDecodingContainer") { return "an object" }
            return "a value of type \(text)"
        }
    }
}
