import FluxClient
import FluxCore
import FluxTesting
import Foundation
import Testing

struct Todo: Codable, Equatable, Sendable {
    var id: Int
    var title: String
    var done = false
}

struct TodoState: Codable, Equatable, Sendable {
    var todos: [Todo] = []
    var nextID = 1
}

struct AddTodo: Codable, Sendable { var title: String }
struct DeleteTodo: Codable, Sendable { var id: Int }

extension Envelope {
    func str(_ key: String) -> String? { string(key).value }
    func num(_ key: String) -> Int? { int(key).value.map { Int($0) } }
    func rawText(_ key: String) -> String? { raw(key).map { String(decoding: $0, as: UTF8.self) } }
    var text: String { String(decoding: body, as: UTF8.self) }
}

let welcomeJSON = #"{"op":"welcome","protocol":1,"server":"fake/1","peer":7,"limits":{"maxFrame":1048576,"storeWindow":64,"queueLimit":1024,"queueTimeout":5000,"handshakeTimeout":5000}}"#

/// Connects a client over a scripted connection, playing fluxd's side of the handshake.
func connectScripted(name: String = "test", role: Role = .client) async throws -> (FluxClient, ScriptedConnection) {
    let fake = ScriptedConnection()
    async let connecting = FluxClient.connect(over: fake, name: name, role: role)
    let hello = try await fake.nextSent()
    #expect(hello.str("op") == "hello")
    fake.reply(welcomeJSON)
    return (try await connecting, fake)
}
