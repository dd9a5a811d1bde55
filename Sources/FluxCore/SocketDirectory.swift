/// What `lstat(2)`/`stat(2)` says about a directory, as far as the socket-directory rules need it.
public struct DirectoryStatus: Equatable, Sendable {
    public enum Kind: String, Sendable {
        case directory
        case symlink = "symbolic link"
        case other = "not a directory"
    }

    public var kind: Kind
    /// The owner (`st_uid`).
    public var uid: UInt32
    /// The permission bits with set-id and sticky bits (`st_mode & 07777`).
    public var mode: UInt32

    public init(kind: Kind, uid: UInt32, mode: UInt32) {
        self.kind = kind
        self.uid = uid
        self.mode = mode & 0o7777
    }
}

/// Why fluxd refuses a socket directory. The description is the whole message fluxd prints: the directory, its
/// owner and mode, what is wrong and what to do.
public struct SocketDirectoryRefusal: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Reason: Equatable, Sendable {
        /// Not a directory (or a symbolic link where a private directory must be a real one).
        case notADirectory
        /// A private directory owned by somebody else; a parent directory owned by neither fluxd's user nor root.
        case foreignOwner
        /// A private directory that group or other users may write to.
        case writableByOthers
        /// A parent directory that group or other users may write to, without the sticky bit.
        case writableWithoutSticky
    }

    /// The directory.
    public var path: String
    public var status: DirectoryStatus
    /// fluxd's effective uid.
    public var euid: UInt32
    public var reason: Reason
    /// The per-user directory of the default socket path (true) or the parent of an explicit path (false).
    public var isPrivate: Bool

    public init(path: String, status: DirectoryStatus, euid: UInt32, reason: Reason, isPrivate: Bool) {
        self.path = path
        self.status = status
        self.euid = euid
        self.reason = reason
        self.isPrivate = isPrivate
    }

    public var description: String {
        let what = isPrivate ? "the socket directory \(path)" : "the socket's directory \(path)"
        let facts = status.kind == .directory
            ? "it is owned by uid \(status.uid) and has mode \(octalMode(status.mode))"
            : status.kind == .symlink
                ? "it is a symbolic link (owned by uid \(status.uid), mode \(octalMode(status.mode)))"
                : "it is not a directory (owned by uid \(status.uid), mode \(octalMode(status.mode)))"
        let problem: String
        let fix: String
        switch (reason, isPrivate) {
        case (.notADirectory, true):
            problem = "fluxd needs a real directory there, owned by its user (uid \(euid)) with mode 0700"
            fix = "remove it (rm \(path)) and fluxd creates the directory, or pass --socket PATH in a directory you own"
        case (.notADirectory, false):
            problem = "a socket needs a directory there"
            fix = "pass --socket PATH in a directory you own"
        case (.foreignOwner, true):
            problem = "fluxd runs as uid \(euid) and uses only a directory it owns (another user may have created this one to intercept the bus)"
            fix = "remove it (rm -r \(path)) and fluxd creates it again with mode 0700, or pass --socket PATH in a directory you own"
        case (.foreignOwner, false):
            problem = "fluxd runs as uid \(euid) and listens only in a directory owned by itself or root (its owner could replace the socket)"
            fix = "pass --socket PATH in a directory you own"
        case (.writableByOthers, _):
            problem = "group or other users can write to it, so they could replace the socket"
            fix = "chmod 700 \(path), or remove it and fluxd creates it again with mode 0700"
        case (.writableWithoutSticky, _):
            problem = "group or other users can write to it and it has no sticky bit, so they could replace the socket"
            fix = "use a directory only you can write to, or set the sticky bit as on /tmp (chmod +t \(path))"
        }
        return "refusing \(what): \(facts); \(problem). To fix: \(fix)"
    }
}

/// The rule for the per-user directory of the default socket path (`$XDG_RUNTIME_DIR/fluxbus`,
/// `<temp dir>/fluxbus-<uid>`), as ssh-agent and tmux check theirs: it must be a real directory (`status` from
/// `lstat`, so not a symbolic link), owned by fluxd's effective uid, with no group or other write bit. Nil: use it.
public func checkPrivateSocketDirectory(_ path: String, status: DirectoryStatus, euid: UInt32) -> SocketDirectoryRefusal? {
    func refuse(_ reason: SocketDirectoryRefusal.Reason) -> SocketDirectoryRefusal {
        SocketDirectoryRefusal(path: path, status: status, euid: euid, reason: reason, isPrivate: true)
    }
    guard status.kind == .directory else { return refuse(.notADirectory) }
    guard status.uid == euid else { return refuse(.foreignOwner) }
    guard status.mode & 0o022 == 0 else { return refuse(.writableByOthers) }
    return nil
}

/// The rule for the directory an explicit socket path (`--socket`, `$FLUXBUS_SOCKET`) lies in, and for the
/// directory holding the per-user one: owned by fluxd's effective uid or by root, and if group or other users may
/// write to it, it must have the sticky bit (like /tmp), so that nobody else can remove or rename what fluxd put
/// there. `status` comes from `stat` (symbolic links followed). Nil: use it.
public func checkSocketParentDirectory(_ path: String, status: DirectoryStatus, euid: UInt32) -> SocketDirectoryRefusal? {
    func refuse(_ reason: SocketDirectoryRefusal.Reason) -> SocketDirectoryRefusal {
        SocketDirectoryRefusal(path: path, status: status, euid: euid, reason: reason, isPrivate: false)
    }
    guard status.kind == .directory else { return refuse(.notADirectory) }
    guard status.uid == euid || status.uid == 0 else { return refuse(.foreignOwner) }
    guard status.mode & 0o022 == 0 || status.mode & 0o1000 != 0 else { return refuse(.writableWithoutSticky) }
    return nil
}

/// `0755`, `1777`: permission bits in octal, at least four digits.
func octalMode(_ mode: UInt32) -> String {
    let digits = String(mode & 0o7777, radix: 8)
    return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
}
