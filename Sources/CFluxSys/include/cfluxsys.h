// Linux calls Swift's Glibc module does not export (they need _GNU_SOURCE).
#pragma once
#include <sys/types.h>

/// fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length): allocates disk space without changing the file's length.
/// Returns 0, or -1 with errno set.
int cfluxsys_reserve(int fd, off_t offset, off_t length);

/// fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length): gives back the disk space of that
/// range (space reserved past a closed segment's end). Returns 0, or -1 with errno set.
int cfluxsys_release(int fd, off_t offset, off_t length);

#include <stddef.h>
#include <stdint.h>

/// CRC-32C (Castagnoli) of `n` bytes at `p`, continuing from `crc` (0 to start; the value is pre- and
/// post-inverted as usual). Uses the CPU's crc32 instruction where it has one (SSE 4.2), else a table.
uint32_t cfluxsys_crc32c(uint32_t crc, const uint8_t *p, size_t n);
/// Seals a journal record whose body (`body_length` bytes) follows its 12-byte header at `record`: writes the
/// header (the body's length, big-endian; that length's CRC-32C; the body's CRC-32C), as docs/journal.md says.
void cfluxsys_seal_record(uint8_t *record, uint32_t body_length);

/// fallocate(fd, 0, offset, length): allocates disk space and extends the file's length over it (reads as
/// zeros). Returns 0, or -1 with errno set.
int cfluxsys_allocate(int fd, off_t offset, off_t length);

/// sd_notify(3) without libsystemd: sends `length` bytes of `message` (newline-separated `NAME=value` fields) as
/// one datagram on a new AF_UNIX SOCK_DGRAM socket to `address`, the value of NOTIFY_SOCKET: a path ("/run/...")
/// or an abstract name ("@name"). Returns 0, or a negative errno (-EINVAL: not a usable address).
int cfluxsys_notify(const char *address, const char *message, size_t length);

/// Whether `fd` is a listening AF_UNIX SOCK_STREAM socket (socket activation's check). Returns 0 when it is and
/// writes the address it is bound to into `path` (NUL-terminated; "" when unnamed, "@name" when abstract);
/// 1: not AF_UNIX, 2: not SOCK_STREAM, 3: not listening; a negative errno when a call failed (-ENOTSOCK: not a
/// socket, -EBADF: not open, -ENAMETOOLONG: `capacity` too small).
int cfluxsys_listening_socket(int fd, char *path, size_t capacity);

/// Bytes the process's malloc has handed out and not had back (glibc's mallinfo2 `uordblks`; 0 under another
/// allocator). For tests that measure what a structure really takes.
size_t cfluxsys_heap_in_use(void);

/// Sets the calling thread's nice value (Linux: `setpriority` on its thread id). 0 or -1 (errno set).
int cfluxsys_nice_thread(int nice);

/// pwrite(2) as the bare system call: glibc's wrapper is a cancellation point, and once the process has a second
/// thread (the journal's sync thread) every call through it pays the cancellation bookkeeping; fluxd's threads
/// are never cancelled. Returns the bytes written, or -1 with errno set.
ssize_t cfluxsys_pwrite(int fd, const void *buffer, size_t count, off_t offset);
