import FluxCore
import Glibc

/// Why fluxd will not listen where it was asked to: the directory breaks a rule (`SocketDirectoryRefusal`), or it
/// could not be created or looked at. The description is the message fluxd prints.
public struct SocketDirectoryError: Error, CustomStringConvertible {
    public enum Problem: Error, Sendable {
        case refused(SocketDirectoryRefusal)
        case system(operation: String, path: String, errno: Int32)
        /// The directory of an explicit socket path does not exist (fluxd creates only its default directory).
        case missingDirectory(String)
    }

    /// The socket path fluxd was to listen on.
    public var socketPath: String
    public var problem: Problem

    public var description: String {
        switch problem {
        case .refused(let refusal): return "cannot listen on \(socketPath): \(refusal)"
        case .system(let operation, let path, let code):
            return "cannot listen on \(socketPath): \(operation) \(path): \(String(cString: strerror(code)))"
        case .missingDirectory(let directory):
            return "cannot listen on \(socketPath): the directory \(directory) does not exist (fluxd creates only its default socket directory: create it, or check the path)"
        }
    }
}

/// Makes sure fluxd may listen at `location` (the thin I/O part around `checkPrivateSocketDirectory` and
/// `checkSocketParentDirectory`), before anything binds:
/// - default path (`location.privateDirectory` set): the directory is created with mode 0700 if missing; an
///   existing one is used only when it is a real directory owned by fluxd's effective uid that no group or other
///   user may write to; the directory holding it must pass the parent rule;
/// - explicit path: the socket's directory must exist (a typo in a path is refused, not served where no client
///   looks), be owned by fluxd's euid or root and, when group or other users may write to it, have the sticky bit.
public func prepareSocketDirectory(for location: SocketLocation, euid: UInt32 = geteuid()) throws(SocketDirectoryError) {
    do {
        try checkSocketDirectory(location, euid: euid)
    } catch {
        throw SocketDirectoryError(socketPath: location.path, problem: error)
    }
}

private func checkSocketDirectory(_ location: SocketLocation, euid: UInt32) throws(SocketDirectoryError.Problem) {
    if let directory = location.privateDirectory {
        let parent = parentDirectory(of: directory)
        let existing = try makeDirectories(parent)
        try checkParent(parent, euid: euid)
        if existing != parent { try checkParent(existing, euid: euid) }
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw .system(operation: "mkdir", path: directory, errno: errno)
        }
        let status = try directoryStatus(directory, followLinks: false)
        if let refusal = checkPrivateSocketDirectory(directory, status: status, euid: euid) { throw .refused(refusal) }
    } else {
        let parent = parentDirectory(of: location.path)
        var st = stat()
        if stat(parent, &st) != 0 && errno == ENOENT { throw .missingDirectory(parent) }
        try checkParent(parent, euid: euid)
    }
}

private func checkParent(_ directory: String, euid: UInt32) throws(SocketDirectoryError.Problem) {
    let status = try directoryStatus(directory, followLinks: true)
    if let refusal = checkSocketParentDirectory(directory, status: status, euid: euid) { throw .refused(refusal) }
}

private func directoryStatus(_ path: String, followLinks: Bool) throws(SocketDirectoryError.Problem) -> DirectoryStatus {
    var st = stat()
    guard (followLinks ? stat(path, &st) : lstat(path, &st)) == 0 else {
        throw .system(operation: followLinks ? "stat" : "lstat", path: path, errno: errno)
    }
    let kind: DirectoryStatus.Kind
    switch st.st_mode & S_IFMT {
    case S_IFDIR: kind = .directory
    case S_IFLNK: kind = .symlink
    default: kind = .other
    }
    return DirectoryStatus(kind: kind, uid: st.st_uid, mode: UInt32(st.st_mode))
}

/// `mkdir -p` with mode 0700 for the missing components; returns the nearest directory that already existed
/// (`directory` itself when nothing was created).
private func makeDirectories(_ directory: String) throws(SocketDirectoryError.Problem) -> String {
    var st = stat()
    if stat(directory, &st) == 0 { return directory }
    guard errno == ENOENT else { throw .system(operation: "stat", path: directory, errno: errno) }
    let parent = parentDirectory(of: directory)
    let existing = parent == directory ? directory : try makeDirectories(parent)
    if mkdir(directory, 0o700) != 0 && errno != EEXIST {
        throw .system(operation: "mkdir", path: directory, errno: errno)
    }
    return existing
}

private func parentDirectory(of path: String) -> String {
    guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "." }
    if slash == path.utf8.startIndex { return "/" }
    return String(path[..<slash])
}
