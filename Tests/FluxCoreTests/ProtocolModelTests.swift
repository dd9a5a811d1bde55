import Foundation
import Testing
@testable import FluxCore

/// The Swift protocol model (FluxCore/ProtocolModel.swift, ErrorCode.swift) against protocol/: these fail when
/// one of them changes without the other.
struct ProtocolModelTests {
    static func json(_ path: String) throws -> [String: Any] {
        let data = try Data(contentsOf: ProtocolFiles.root.appendingPathComponent(path))
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    static func schemaProperty(_ file: String, _ key: String) throws -> [String: Any] {
        let schema = try json("schemas/" + file)
        let properties = try #require(schema["properties"] as? [String: Any])
        return try #require(properties[key] as? [String: Any], "\(file) has no property \(key)")
    }

    @Test("every op and direction of schemas/index.json, and no other")
    func ops() throws {
        let index = try Self.json("schemas/index.json")
        let entries = try #require(index["schemas"] as? [[String: Any]])
        var fromSchemas: [String: Set<String>] = [:]
        for entry in entries {
            let op = try #require(entry["op"] as? String)
            let direction = try #require(entry["direction"] as? String)
            fromSchemas[op, default: []].insert(direction)
        }
        var fromModel: [String: Set<String>] = [:]
        for op in Op.allCases { fromModel[op.rawValue] = Set(op.directions.map(\.rawValue)) }
        #expect(fromModel == fromSchemas)
        #expect(Op.received("welcome") == nil && Op.received("dispatch") == .dispatch && Op.received("nope") == nil)
    }

    @Test("roles are hello.role's enum; store statuses are subscribed.status's enum")
    func enums() throws {
        let roles = try #require(try Self.schemaProperty("hello.c2d.schema.json", "role")["enum"] as? [String])
        #expect(Set(roles) == Set(Role.allCases.map(\.rawValue)))
        let statuses = try #require(try Self.schemaProperty("subscribed.d2c.schema.json", "status")["enum"] as? [String])
        #expect(Set(statuses) == Set(StoreStatus.allCases.map(\.rawValue)))
    }

    @Test("limit names are welcome.limits' properties")
    func limits() throws {
        let limits = try Self.schemaProperty("welcome.d2c.schema.json", "limits")
        let keys = try #require(limits["properties"] as? [String: Any]).keys
        #expect(Set(keys) == Set(LimitName.allCases.map(\.rawValue)))
    }

    @Test("error codes are the first column of SPEC §11's table")
    func errorCodes() throws {
        let spec = try String(contentsOf: ProtocolFiles.root.appendingPathComponent("SPEC.md"), encoding: .utf8)
        let section = try #require(spec.components(separatedBy: "\n## 11.").dropFirst().first)
            .components(separatedBy: "\n## ").first ?? ""
        var codes: Set<String> = []
        for line in section.split(separator: "\n") where line.hasPrefix("| `") {
            let cell = line.dropFirst(3).prefix { $0 != "`" }
            codes.insert(String(cell))
        }
        #expect(codes == Set(ErrorCode.allCases.map(\.rawValue)))
    }

    @Test("name rules match the schemas' patterns and lengths")
    func names() throws {
        let store = try Self.schemaProperty("subscribe.c2d.schema.json", "store")
        #expect(store["maxLength"] as? Int == Names.maxStoreBytes || (store["pattern"] as? String)?.contains("{1,128}") == true)
        #expect(Names.isValidStore(String(repeating: "a", count: 128)))
        #expect(!Names.isValidStore(String(repeating: "a", count: 129)))
        #expect(!Names.isValidStore("") && !Names.isValidStore("a b") && !Names.isValidStore("todo*"))
        #expect(Names.isValidType(String(repeating: "t", count: 256)) && !Names.isValidType(String(repeating: "t", count: 257)))
        #expect(Names.isValidPattern("*") && Names.isValidPattern("todo/*") && Names.isValidPattern("todo*"))
        #expect(!Names.isValidPattern("*todo") && !Names.isValidPattern("to*do") && !Names.isValidPattern("**"))
        #expect(Names.isValidPattern(String(repeating: "t", count: 255) + "*"))
        #expect(!Names.isValidPattern(String(repeating: "t", count: 256) + "*"))
        #expect(Names.isValidID("x") && !Names.isValidID("") && !Names.isValidID(String(repeating: "i", count: 257)))
        #expect(Names.isValidWorker("todo-store") && !Names.isValidWorker("app/todos"))
        #expect(Names.isValidInteger(0) && !Names.isValidInteger(0, positive: true))
        #expect(Names.isValidInteger(Names.maxInteger) && !Names.isValidInteger(Names.maxInteger + 1))
        #expect(!Names.isValidInteger(-1))
    }
}
