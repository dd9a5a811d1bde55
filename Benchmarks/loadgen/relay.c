/* relay: the physical floor. A bare Unix-socket pub/sub relay with the least work a broker can do:
 * client -> relay -> echo (store) -> relay -> every client subscribed to the topic.
 *
 * Frames: 4-byte big-endian length N, then N bytes. Body byte 0 is the kind, bytes 1..4 a little-endian topic.
 *   'H' hello: body[5] = 'E' (the echo/store connection) or 'C' (a client); topic = subscription (0xFFFFFFFF none)
 *   'A' action (client -> echo): forwarded unchanged to the echo connection
 *   'S' state (echo -> clients): forwarded unchanged to every client subscribed to its topic
 *   'P' ping: sent back to the sender (a barrier after the hello)
 * One epoll loop, one thread; all frames queued for one connection in one iteration go out in one write.
 *
 * Usage: relay SOCKET_PATH   (prints "relay ready" once listening; SIGTERM ends it) */
#include "common.h"
#include <signal.h>

#define MAX_TOPICS 4096

typedef struct conn {
    int fd;
    buf_t in, out;
    int is_echo;
    int dirty;        /* queued output this iteration */
    int want_out;     /* EPOLLOUT armed */
    struct conn *next_dirty;
} conn_t;

static int ep;
static conn_t *echo_conn;
static conn_t **subs[MAX_TOPICS];
static int nsubs[MAX_TOPICS], capsubs[MAX_TOPICS];
static conn_t *dirty_head;

static void mark_dirty(conn_t *c) {
    if (!c->dirty) { c->dirty = 1; c->next_dirty = dirty_head; dirty_head = c; }
}

static void close_conn(conn_t *c) {
    /* Benchmark runs end by killing the relay; a closing peer is just dropped from every list. */
    for (int t = 0; t < MAX_TOPICS; t++)
        for (int i = 0; i < nsubs[t]; i++)
            if (subs[t][i] == c) { subs[t][i] = subs[t][--nsubs[t]]; i--; }
    if (echo_conn == c) echo_conn = NULL;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1; /* freed lazily: it may sit on the dirty list */
}

static void handle_frames(conn_t *c) {
    while (buf_avail(&c->in) >= 4) {
        const uint8_t *p = c->in.data + c->in.pos;
        uint32_t n = be32(p);
        if (buf_avail(&c->in) < 4 + (size_t)n) break;
        const uint8_t *body = p + 4;
        uint32_t topic = 0;
        if (n >= 5) memcpy(&topic, body + 1, 4);
        switch (n > 0 ? body[0] : 0) {
        case 'H':
            if (n >= 6 && body[5] == 'E') { c->is_echo = 1; echo_conn = c; }
            else if (topic < MAX_TOPICS) {
                if (nsubs[topic] == capsubs[topic]) {
                    capsubs[topic] = capsubs[topic] ? capsubs[topic] * 2 : 4;
                    subs[topic] = realloc(subs[topic], sizeof(conn_t *) * (size_t)capsubs[topic]);
                }
                subs[topic][nsubs[topic]++] = c;
            }
            break;
        case 'P': /* ping: answered to the sender, a barrier after the hello */
            buf_append(&c->out, p, 4 + n); mark_dirty(c);
            break;
        case 'A':
            if (echo_conn) { buf_append(&echo_conn->out, p, 4 + n); mark_dirty(echo_conn); }
            break;
        case 'S':
            if (topic < MAX_TOPICS)
                for (int i = 0; i < nsubs[topic]; i++) {
                    conn_t *s = subs[topic][i];
                    buf_append(&s->out, p, 4 + n);
                    mark_dirty(s);
                }
            break;
        }
        c->in.pos += 4 + n;
    }
}

static void flush_dirty(void) {
    while (dirty_head) {
        conn_t *c = dirty_head; dirty_head = c->next_dirty; c->dirty = 0;
        if (c->fd < 0) continue;
        int done = buf_flush_fd(&c->out, c->fd);
        if (!done && !c->want_out) {
            struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
            epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev); c->want_out = 1;
        } else if (done && c->want_out) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
            epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev); c->want_out = 0;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: relay SOCKET_PATH\n"); return 2; }
    signal(SIGPIPE, SIG_IGN);
    unlink(argv[1]);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {0}; sa.sun_family = AF_UNIX;
    strncpy(sa.sun_path, argv[1], sizeof sa.sun_path - 1);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0) die("bind");
    if (listen(lfd, 4096) < 0) die("listen");
    ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
    printf("relay ready on %s\n", argv[1]); fflush(stdout);
    struct epoll_event evs[256];
    for (;;) {
        int k = epoll_wait(ep, evs, 256, -1);
        if (k < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
        for (int i = 0; i < k; i++) {
            conn_t *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    conn_t *nc = calloc(1, sizeof *nc); nc->fd = fd;
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
                }
                continue;
            }
            if (c->fd < 0) continue;
            if (evs[i].events & EPOLLOUT) mark_dirty(c);
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t n = buf_read_fd(&c->in, c->fd);
                if (n == 0) { close_conn(c); continue; }
                if (n > 0) handle_frames(c);
            }
        }
        flush_dirty();
    }
}
