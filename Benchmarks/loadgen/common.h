/* Shared helpers for the FluxBus benchmark programs: growable byte buffers, socket setup, time.
 * Everything is single-threaded and non-blocking after setup; writes are coalesced per loop iteration. */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static inline void die(const char *what) {
    fprintf(stderr, "bench: %s: %s\n", what, strerror(errno));
    exit(2);
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct {
    uint8_t *data;
    size_t len;   /* bytes held */
    size_t pos;   /* bytes already consumed (reads) or written (writes) */
    size_t cap;
} buf_t;

static inline void buf_reserve(buf_t *b, size_t extra) {
    if (b->pos > 0 && b->pos == b->len) { b->pos = 0; b->len = 0; }
    if (b->len + extra <= b->cap) return;
    if (b->pos > 0) { /* compact first */
        memmove(b->data, b->data + b->pos, b->len - b->pos);
        b->len -= b->pos; b->pos = 0;
        if (b->len + extra <= b->cap) return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    b->data = realloc(b->data, cap);
    if (!b->data) die("realloc");
    b->cap = cap;
}

static inline void buf_append(buf_t *b, const void *p, size_t n) {
    buf_reserve(b, n);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static inline size_t buf_avail(const buf_t *b) { return b->len - b->pos; }

/* Reads what the socket has into b. Returns bytes read, 0 on EOF, -1 if it would block. */
static inline ssize_t buf_read_fd(buf_t *b, int fd) {
    buf_reserve(b, 65536);
    ssize_t n = read(fd, b->data + b->len, b->cap - b->len);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return -1;
        die("read");
    }
    b->len += (size_t)n;
    return n;
}

/* Writes as much of b as the socket takes. Returns 1 when b is empty, 0 if bytes remain. */
static inline int buf_flush_fd(buf_t *b, int fd) {
    while (b->pos < b->len) {
        ssize_t n = write(fd, b->data + b->pos, b->len - b->pos);
        if (n < 0) {
            if (errno == EAGAIN) return 0;
            if (errno == EINTR) continue;
            die("write");
        }
        b->pos += (size_t)n;
    }
    b->pos = b->len = 0;
    return 1;
}

static inline void set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) die("fcntl");
}

static inline void set_block(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) die("fcntl");
}

/* "unix:/path" or "tcp:host:port" (or a bare path). Blocking connect. */
static inline int dial(const char *addr) {
    if (strncmp(addr, "tcp:", 4) == 0) {
        char host[256]; const char *colon = strrchr(addr + 4, ':');
        if (!colon) { fprintf(stderr, "bad address %s\n", addr); exit(2); }
        size_t hl = (size_t)(colon - (addr + 4)); memcpy(host, addr + 4, hl); host[hl] = 0;
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET; sa.sin_port = htons((uint16_t)atoi(colon + 1));
        inet_pton(AF_INET, host, &sa.sin_addr);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket");
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) die("connect tcp");
        int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
    }
    const char *path = strncmp(addr, "unix:", 5) == 0 ? addr + 5 : addr;
    struct sockaddr_un sa = {0};
    sa.sun_family = AF_UNIX;
    strncpy(sa.sun_path, path, sizeof sa.sun_path - 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    for (int attempt = 0;; attempt++) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) break;
        /* A burst of connects (10k idle connections) can overflow the listen backlog: retry briefly. */
        if ((errno == EAGAIN || errno == ECONNREFUSED) && attempt < 2000) { usleep(1000); continue; }
        die("connect unix");
    }
    return fd;
}

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* Parses a decimal number at p (stops at the first non-digit). */
static inline uint64_t parse_u64(const uint8_t *p, const uint8_t *end) {
    uint64_t v = 0;
    while (p < end && *p >= '0' && *p <= '9') { v = v * 10 + (uint64_t)(*p - '0'); p++; }
    return v;
}

/* Writes v as decimal into a field of width w, left-aligned, padded with `pad`. */
static inline void put_dec_padded(uint8_t *p, int w, uint64_t v, uint8_t pad) {
    char tmp[24]; int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    memset(p, pad, (size_t)w);
    memcpy(p, tmp, (size_t)(n < w ? n : w));
}

/* Zero-padded fixed-width decimal (for the opaque payloads of the peers). */
static inline void put_dec_zero(uint8_t *p, int w, uint64_t v) {
    for (int i = w - 1; i >= 0; i--) { p[i] = (uint8_t)('0' + v % 10); v /= 10; }
}

#endif
