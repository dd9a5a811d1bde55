import FluxDaemon
import Testing

@Suite("The metrics endpoint's HTTP handling and addresses (pure)")
struct MetricsHTTPTests {
    private func answer(_ text: String) -> MetricsHTTP.Answer { MetricsHTTP.answer(to: Array(text.utf8)) }

    @Test("GET and HEAD /metrics (a query string ignored); other paths 404, other methods 405, junk 400")
    func answers() {
        #expect(answer("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == .metrics(head: false))
        #expect(answer("GET /metrics?x=1 HTTP/1.0\r\n\r\n") == .metrics(head: false))
        #expect(answer("HEAD /metrics HTTP/1.1\n\n") == .metrics(head: true))
        #expect(answer("GET / HTTP/1.1\r\n\r\n") == .error(status: 404, reason: "fluxd serves /metrics only"))
        #expect(answer("POST /metrics HTTP/1.1\r\n\r\n") == .error(status: 405, reason: "only GET and HEAD"))
        #expect(answer("GET /metrics HTTP/2\r\n\r\n") == .error(status: 400, reason: "not an HTTP/1.x request line"))
        #expect(answer("GET  /metrics HTTP/1.1\r\n\r\n") == .error(status: 400, reason: "not an HTTP/1.x request line"))
        #expect(answer("\r\n\r\n") == .error(status: 400, reason: "not an HTTP/1.x request line"))
    }

    @Test("a head is read until its blank line, and at most 8 KiB of it")
    func incompleteAndTooLarge() {
        #expect(answer("GET /metrics HTTP/1.1\r\nHost: x\r\n") == .incomplete)
        #expect(answer("") == .incomplete)
        let huge = "GET /metrics HTTP/1.1\r\n" + String(repeating: "X-A: b\r\n", count: 2000)
        #expect(answer(huge) == .error(status: 431, reason: "request head too large"))
        #expect(answer(huge + "\r\n") == .error(status: 431, reason: "request head too large"))
    }

    @Test("responses: status line, content type and length, Connection: close; HEAD has no body")
    func responses() {
        let ok = String(decoding: MetricsHTTP.response(.metrics(head: false)) { Array("a 1\n".utf8) }, as: UTF8.self)
        #expect(ok == "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: 4\r\nConnection: close\r\n\r\na 1\n")
        let head = String(decoding: MetricsHTTP.response(.metrics(head: true)) { Array("a 1\n".utf8) }, as: UTF8.self)
        #expect(head.hasSuffix("Content-Length: 4\r\nConnection: close\r\n\r\n"))
        let notAllowed = String(decoding: MetricsHTTP.response(.error(status: 405, reason: "only GET and HEAD")) { [] }, as: UTF8.self)
        #expect(notAllowed.hasPrefix("HTTP/1.1 405 Method Not Allowed\r\n") && notAllowed.contains("Allow: GET, HEAD\r\n"))
    }

    @Test("random bytes never crash the parser and always get an answer with a known status or a request to read more")
    func randomBytes() {
        var generator = SystemRandomNumberGenerator()
        let alphabet = Array("GETHEAD/metrics HTTP/1.01\r\n?: x".utf8) + [0, 255, 32]
        for _ in 0..<20_000 {
            let count = Int.random(in: 0...64, using: &generator)
            let bytes = (0..<count).map { _ in
                Bool.random(using: &generator) ? alphabet.randomElement(using: &generator)! : UInt8.random(in: 0...255, using: &generator)
            }
            switch MetricsHTTP.answer(to: bytes) {
            case .incomplete, .metrics: break
            case .error(let status, _): #expect([400, 404, 405, 431].contains(status))
            }
        }
    }

    @Test("addresses: loopback only, IPv4, IPv6 in brackets, localhost; port 0 allowed")
    func addresses() throws {
        #expect(try MetricsAddress.parse("127.0.0.1:9464").get() == MetricsAddress(host: "127.0.0.1", port: 9464))
        #expect(try MetricsAddress.parse("localhost:0").get() == MetricsAddress(host: "127.0.0.1", port: 0))
        #expect(try MetricsAddress.parse("[::1]:9464").get().description == "[::1]:9464")
        for bad in ["0.0.0.0:9464", "192.168.1.2:80", "127.0.0.1", "127.0.0.1:70000", "[::1]9464", ":9464", "[::]:1"] {
            #expect(throws: MetricsAddressError.self, "\(bad)") { try MetricsAddress.parse(bad).get() }
        }
    }
}
