import Foundation
import Testing
@testable import FluxCore

/// protocol/vectors/socket-path.json through `defaultSocketPath(environment:uid:)`: the one default-path rule that
/// fluxd, the Swift SDK, fluxctl and the Python and Node clients share.
struct SocketPathVectorTests {
    struct Case: Decodable, CustomTestStringConvertible {
        var name: String
        var env: [String: String]
        var uid: UInt32
        var path: String
        var testDescription: String { name }
    }

    struct File: Decodable { var cases: [Case] }

    static let cases: [Case] = {
        do { return try JSONDecoder().decode(File.self, from: ProtocolFiles.vectors("socket-path.json")).cases }
        catch { fatalError("cannot read socket-path.json: \(error)") }
    }()

    @Test("the vector file covers FLUXBUS_SOCKET, XDG_RUNTIME_DIR and TMPDIR set, empty and unset")
    func coverage() {
        for key in ["FLUXBUS_SOCKET", "XDG_RUNTIME_DIR", "TMPDIR"] {
            #expect(Self.cases.contains { ($0.env[key] ?? "").isEmpty == false }, "\(key) set")
            #expect(Self.cases.contains { $0.env[key] == "" }, "\(key) empty")
            #expect(Self.cases.contains { $0.env[key] == nil }, "\(key) unset")
        }
    }

    @Test(arguments: cases)
    func vector(_ c: Case) {
        #expect(defaultSocketPath(environment: c.env, uid: c.uid) == c.path)
    }

    @Test("the default directory is private unless the path came from FLUXBUS_SOCKET")
    func privateDirectory() {
        #expect(defaultSocketLocation(environment: ["FLUXBUS_SOCKET": "/srv/x.sock"], uid: 5).privateDirectory == nil)
        #expect(defaultSocketLocation(environment: ["XDG_RUNTIME_DIR": "/run/user/5"], uid: 5).privateDirectory
                == "/run/user/5/fluxbus")
        #expect(defaultSocketLocation(environment: ["TMPDIR": "/var/tmp/"], uid: 5).privateDirectory == "/var/tmp/fluxbus-5")
    }

    @Test("without arguments it reads the process environment and getuid()")
    func processEnvironment() {
        let env = ProcessInfo.processInfo.environment
        #expect(defaultSocketPath() == defaultSocketPath(environment: env, uid: getuid()))
    }
}

/// The socket-directory rules as pure functions of the stat results.
struct SocketDirectoryRuleTests {
    static let me: UInt32 = 1000

    static func dir(_ uid: UInt32, _ mode: UInt32) -> DirectoryStatus { DirectoryStatus(kind: .directory, uid: uid, mode: mode) }

    @Test("private directory: a real directory of fluxd's euid without group/other write bits is used",
          arguments: [0o700, 0o750, 0o755, 0o500, 0o1700] as [UInt32])
    func privateAccepted(mode: UInt32) {
        #expect(checkPrivateSocketDirectory("/tmp/fluxbus-1000", status: Self.dir(Self.me, mode), euid: Self.me) == nil)
    }

    @Test("private directory: group or other writable is refused, also when fluxd owns it",
          arguments: [0o777, 0o770, 0o720, 0o702, 0o1777] as [UInt32])
    func privateWritable(mode: UInt32) throws {
        let refusal = try #require(checkPrivateSocketDirectory("/tmp/fluxbus-1000", status: Self.dir(Self.me, mode), euid: Self.me))
        #expect(refusal.reason == .writableByOthers)
    }

    @Test("private directory: another owner is refused, root's too (a squatter's 0777 dir is named with its owner and mode)")
    func privateForeign() throws {
        let squatted = try #require(checkPrivateSocketDirectory("/tmp/fluxbus-0", status: Self.dir(1000, 0o777), euid: 0))
        #expect(squatted.reason == .foreignOwner)
        #expect(squatted.description.contains("/tmp/fluxbus-0"))
        #expect(squatted.description.contains("owned by uid 1000"))
        #expect(squatted.description.contains("mode 0777"))
        #expect(squatted.description.contains("rm -r /tmp/fluxbus-0"))
        #expect(checkPrivateSocketDirectory("/x", status: Self.dir(0, 0o700), euid: Self.me)?.reason == .foreignOwner)
    }

    @Test("private directory: a symbolic link or a file is refused")
    func privateNotADirectory() {
        for kind in [DirectoryStatus.Kind.symlink, .other] {
            let status = DirectoryStatus(kind: kind, uid: Self.me, mode: 0o700)
            #expect(checkPrivateSocketDirectory("/x", status: status, euid: Self.me)?.reason == .notADirectory)
        }
    }

    @Test("parent of an explicit path: owned by fluxd's euid or root, not writable by others unless sticky")
    func parent() {
        func check(_ uid: UInt32, _ mode: UInt32) -> SocketDirectoryRefusal.Reason? {
            checkSocketParentDirectory("/srv/bus", status: Self.dir(uid, mode), euid: Self.me)?.reason
        }
        #expect(check(Self.me, 0o700) == nil)
        #expect(check(Self.me, 0o755) == nil)
        #expect(check(0, 0o755) == nil)
        #expect(check(0, 0o1777) == nil)            // /tmp
        #expect(check(Self.me, 0o1777) == nil)
        #expect(check(Self.me, 0o777) == .writableWithoutSticky)
        #expect(check(0, 0o775) == .writableWithoutSticky)
        #expect(check(0, 0o757) == .writableWithoutSticky)
        #expect(check(2000, 0o755) == .foreignOwner)
        #expect(check(2000, 0o1777) == .foreignOwner)
        #expect(checkSocketParentDirectory("/f", status: DirectoryStatus(kind: .other, uid: 0, mode: 0o644), euid: 0)?.reason
                == .notADirectory)
    }

    @Test("messages name the directory, its owner and mode, and what to do")
    func messages() {
        let sticky = checkSocketParentDirectory("/srv/bus", status: Self.dir(0, 0o777), euid: Self.me)!.description
        #expect(sticky == "refusing the socket's directory /srv/bus: it is owned by uid 0 and has mode 0777; group or other users can write to it and it has no sticky bit, so they could replace the socket. To fix: use a directory only you can write to, or set the sticky bit as on /tmp (chmod +t /srv/bus)")
        let open = checkPrivateSocketDirectory("/run/user/1000/fluxbus", status: Self.dir(Self.me, 0o775), euid: Self.me)!.description
        #expect(open.contains("chmod 700 /run/user/1000/fluxbus"))
        #expect(open.contains("mode 0775"))
    }
}
