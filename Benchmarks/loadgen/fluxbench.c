/* fluxbench: the one load generator and the one minimal store program used for every system measured.
 *
 * The pattern is the same for each system: a client sends an "action" (~100 bytes) to a topic; a store process
 * receives it, counts it and publishes a "state" (200 B .. 1 MB) on that topic; every subscriber of the topic
 * receives it. A round trip ends when every subscriber of the topic has a state whose counter reaches the
 * action's number. All frames are pre-encoded templates (the store patches a counter in place), so the figures
 * measure the broker, not this program.
 *
 * Systems (--sys): relay (the floor, relay.c), flux (fluxd), redis (RESP3 pub/sub), mqtt (Mosquitto, QoS 0),
 * nats (core NATS). D-Bus has its own program (dbusbench.c) because libdbus owns its I/O.
 *
 *   fluxbench store  --sys S --addr A [--topics T] [--state BYTES]
 *   fluxbench client --sys S --addr A [--clients C] [--subs N] [--window W] [--count K] [--warmup X]
 *                    [--idle I] [--slow] [--state BYTES] [--rss-pid PID] [--store-pid PID] [--timeout SECS]
 *                    [--label L] [--redis-write]
 *
 * --subs 0: each of the C clients subscribes to its own topic on its own connection (workloads 1, 2).
 * --subs N: one client (C must be 1) dispatches to topic 0 and N other connections subscribe to it (3, 4).
 * --idle I: I more connections complete the handshake and stay idle during the run (5).
 * --slow:   one more connection subscribes to every topic and never reads (6).
 * --hold:   open the --idle connections, print "idle ready" and keep them until killed (profiling).
 * --redis-write (store and client, redis only; workload 8): every message also makes a durable write, as a durable
 *           fluxd journals both the action and the state: the client's action is `XADD a.<t> * p <payload>`
 *           followed by the PUBLISH, the store's reply is `SET s.<t> <state>` followed by its PUBLISH (each pair
 *           in one write). Run against a Redis with appendonly yes; its replies (bulk, +OK, integers) are skipped.
 * The client prints one JSON object with the figures on stdout. Latencies are exact: every sample is kept and
 * sorted (no histogram bucketing). */
#include "common.h"
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>

enum { SYS_RELAY, SYS_FLUX, SYS_REDIS, SYS_MQTT, SYS_NATS };
static int sys_id = -1;
static const char *sys_name;
static const char *addr;
static size_t state_size = 200;
static const size_t action_size = 100;
static int redis_write = 0; /* --redis-write: XADD before each action's PUBLISH, SET before each state's */

enum { M_NONE, M_WELCOME, M_READY, M_ACTION, M_STATE, M_OTHER };
typedef struct { int kind; uint32_t topic; uint64_t counter; uint64_t seq; } msg_t;

typedef struct conn {
    int fd;
    buf_t in, out;
    int driver;        /* topic this connection receives states for (subscriber), -1 none */
    uint64_t latest;   /* highest counter seen */
    uint64_t base;     /* counter of the retained state received at subscription (fluxd keeps it) */
    int dirty;
} conn_t;

/* ------------------------------------------------------------------ parsing helpers */

static const uint8_t *find(const uint8_t *hay, size_t n, const char *needle) {
    return memmem(hay, n, needle, strlen(needle));
}

/* RESP3: returns a pointer just past one complete element, or NULL if incomplete. */
static const uint8_t *resp_skip(const uint8_t *p, const uint8_t *end) {
    if (p >= end) return NULL;
    const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return NULL;
    long n;
    switch (*p) {
    case '+': case '-': case ':': case '_': case ',': case '#': case '(':
        return nl + 1;
    case '$': case '=': case '!':
        n = strtol((const char *)p + 1, NULL, 10);
        if (n < 0) return nl + 1;
        if (end - (nl + 1) < n + 2) return NULL;
        return nl + 1 + n + 2;
    case '*': case '>': case '~': case '%': case '|': {
        n = strtol((const char *)p + 1, NULL, 10);
        if (*p == '%' || *p == '|') n *= 2;
        const uint8_t *q = nl + 1;
        for (long i = 0; i < n; i++) { q = resp_skip(q, end); if (!q) return NULL; }
        return q;
    }
    default:
        fprintf(stderr, "resp: unexpected byte %c\n", *p); exit(2);
    }
}

/* RESP bulk string at p: sets s and len. Returns pointer past it. */
static const uint8_t *resp_bulk(const uint8_t *p, const uint8_t **s, long *len) {
    const uint8_t *nl = memchr(p, '\n', 32);
    *len = strtol((const char *)p + 1, NULL, 10);
    *s = nl + 1;
    return nl + 1 + *len + 2;
}

static uint32_t topic_after_dot(const uint8_t *s, size_t n) {
    /* "a.N", "s.N", "a/N", "s/N" */
    return (uint32_t)parse_u64(s + 2, s + n);
}

/* Produces the next complete message from c->in, or returns 0 if more bytes are needed. */
static int next_msg(conn_t *c, msg_t *m) {
    const uint8_t *p = c->in.data + c->in.pos, *end = c->in.data + c->in.len;
    size_t avail = (size_t)(end - p);
    m->kind = M_OTHER; m->topic = 0; m->counter = 0; m->seq = 0;
    switch (sys_id) {
    case SYS_RELAY: {
        if (avail < 4) return 0;
        uint32_t n = be32(p);
        if (avail < 4 + (size_t)n) return 0;
        const uint8_t *b = p + 4;
        memcpy(&m->topic, b + 1, 4);
        if (b[0] == 'A') { m->kind = M_ACTION; }
        else if (b[0] == 'S') { m->kind = M_STATE; m->counter = parse_u64(b + 5, b + 15); }
        else if (b[0] == 'P') { m->kind = M_READY; }
        c->in.pos += 4 + n;
        return 1;
    }
    case SYS_FLUX: {
        if (avail < 4) return 0;
        uint32_t n = be32(p);
        if (avail < 4 + (size_t)n) return 0;
        const uint8_t *b = p + 4;
        size_t head = n < 200 ? n : 200;
        if (n > 8 && memcmp(b, "{\"op\":\"", 7) == 0) {
            const uint8_t *op = b + 7;
            const uint8_t *st = find(b, head, "\"store\":\"b");
            if (st) m->topic = (uint32_t)parse_u64(st + 10, b + n);
            if (memcmp(op, "snapshot\"", 9) == 0) {
                const uint8_t *k = find(b, n, "{\"n\":");
                m->kind = M_STATE;
                if (k) m->counter = parse_u64(k + 5, b + n);
            } else if (memcmp(op, "action\"", 7) == 0) {
                const uint8_t *s = find(b, head, "\"seq\":");
                m->kind = M_ACTION;
                if (s) m->seq = parse_u64(s + 6, b + n);
            } else if (memcmp(op, "welcome\"", 8) == 0) {
                m->kind = M_WELCOME;
            } else if (memcmp(op, "subscribed\"", 11) == 0 || memcmp(op, "registered\"", 11) == 0
                       || memcmp(op, "pong\"", 5) == 0) {
                m->kind = M_READY;
                const uint8_t *v = find(b, head, "\"version\":");
                if (v && op[0] == 's') m->seq = parse_u64(v + 10, b + n); /* retained version: a snapshot follows */
            } else if (memcmp(op, "error\"", 6) == 0) {
                fprintf(stderr, "fluxd error: %.*s\n", (int)n, b);
            }
        }
        c->in.pos += 4 + n;
        return 1;
    }
    case SYS_REDIS: {
        const uint8_t *q = resp_skip(p, end);
        if (!q) return 0;
        if (*p == '>') {
            const uint8_t *s, *ch, *pl; long sl, chl, pll;
            const uint8_t *r = memchr(p, '\n', 16) + 1;
            r = resp_bulk(r, &s, &sl);
            if (sl == 7 && memcmp(s, "message", 7) == 0) {
                r = resp_bulk(r, &ch, &chl);
                resp_bulk(r, &pl, &pll);
                m->topic = topic_after_dot(ch, (size_t)chl);
                if (ch[0] == 'a') m->kind = M_ACTION;
                else { m->kind = M_STATE; m->counter = parse_u64(pl, pl + 10); }
            } else if (sl == 9 && memcmp(s, "subscribe", 9) == 0) {
                m->kind = M_READY;
            }
        } else if (*p == '+' && avail >= 5 && memcmp(p, "+PONG", 5) == 0) {
            m->kind = M_READY;
        } else if (*p == '-') {
            fprintf(stderr, "redis error: %.*s\n", (int)(q - p), p);
        }
        c->in.pos += (size_t)(q - p);
        return 1;
    }
    case SYS_MQTT: {
        if (avail < 2) return 0;
        size_t rem = 0, mul = 1, i = 1;
        for (;; i++) {
            if (i >= avail) return 0;
            rem += (p[i] & 127) * mul; mul *= 128;
            if (!(p[i] & 128)) break;
        }
        size_t total = i + 1 + rem;
        if (avail < total) return 0;
        const uint8_t *v = p + i + 1;
        switch (p[0] >> 4) {
        case 2: m->kind = M_WELCOME; break;
        case 9: m->kind = M_READY; break;
        case 3: {
            size_t tl = ((size_t)v[0] << 8) | v[1];
            const uint8_t *t = v + 2, *pl = v + 2 + tl;
            m->topic = topic_after_dot(t, tl);
            if (t[0] == 'a') m->kind = M_ACTION;
            else { m->kind = M_STATE; m->counter = parse_u64(pl, pl + 10); }
            break;
        }
        }
        c->in.pos += total;
        return 1;
    }
    case SYS_NATS: {
        const uint8_t *nl = memchr(p, '\n', avail);
        if (!nl) return 0;
        size_t ll = (size_t)(nl + 1 - p);
        if (avail >= 4 && memcmp(p, "MSG ", 4) == 0) {
            /* MSG <subject> <sid> [reply] <size>\r\n<payload>\r\n */
            const uint8_t *sp = nl - 1; /* '\r' */
            const uint8_t *ls = sp; while (ls[-1] != ' ') ls--;
            size_t sz = (size_t)parse_u64(ls, sp);
            if (avail < ll + sz + 2) return 0;
            const uint8_t *subj = p + 4, *se = memchr(subj, ' ', 64);
            const uint8_t *pl = nl + 1;
            m->topic = topic_after_dot(subj, (size_t)(se - subj));
            if (subj[0] == 'a') m->kind = M_ACTION;
            else { m->kind = M_STATE; m->counter = parse_u64(pl, pl + 10); }
            c->in.pos += ll + sz + 2;
            return 1;
        }
        if (memcmp(p, "PING", 4) == 0) { buf_append(&c->out, "PONG\r\n", 6); c->dirty = 1; }
        else if (memcmp(p, "PONG", 4) == 0) m->kind = M_READY;
        else if (memcmp(p, "INFO", 4) == 0) m->kind = M_WELCOME;
        else if (memcmp(p, "-ERR", 4) == 0) fprintf(stderr, "nats: %.*s", (int)ll, p);
        c->in.pos += ll;
        return 1;
    }
    }
    return 0;
}

/* ------------------------------------------------------------------ encoders */

static void frame_be(buf_t *b, const void *body, size_t n) {
    uint8_t h[4]; put_be32(h, (uint32_t)n);
    buf_append(b, h, 4); buf_append(b, body, n);
}

static size_t mqtt_remlen(uint8_t *o, size_t n) {
    size_t i = 0;
    do { uint8_t d = n % 128; n /= 128; if (n) d |= 128; o[i++] = d; } while (n);
    return i;
}

static void mqtt_packet(buf_t *b, uint8_t type, const uint8_t *v, size_t n) {
    uint8_t h[8]; h[0] = type; size_t k = 1 + mqtt_remlen(h + 1, n);
    buf_append(b, h, k); buf_append(b, v, n);
}

static void mqtt_publish(buf_t *b, const char *topic, const uint8_t *payload, size_t n) {
    size_t tl = strlen(topic);
    uint8_t *v = malloc(2 + tl + n);
    v[0] = (uint8_t)(tl >> 8); v[1] = (uint8_t)tl; memcpy(v + 2, topic, tl); memcpy(v + 2 + tl, payload, n);
    mqtt_packet(b, 0x30, v, 2 + tl + n); free(v);
}

static void mqtt_connect(buf_t *b, const char *id) {
    uint8_t v[128]; size_t k = 0, il = strlen(id);
    const uint8_t pre[] = {0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 0}; /* clean session, no keepalive */
    memcpy(v, pre, sizeof pre); k = sizeof pre;
    v[k++] = (uint8_t)(il >> 8); v[k++] = (uint8_t)il; memcpy(v + k, id, il); k += il;
    mqtt_packet(b, 0x10, v, k);
}

static void mqtt_subscribe(buf_t *b, const char *topic, uint16_t pid) {
    uint8_t v[128]; size_t k = 0, tl = strlen(topic);
    v[k++] = (uint8_t)(pid >> 8); v[k++] = (uint8_t)pid;
    v[k++] = (uint8_t)(tl >> 8); v[k++] = (uint8_t)tl; memcpy(v + k, topic, tl); k += tl; v[k++] = 0;
    mqtt_packet(b, 0x82, v, k);
}

static void redis_cmd(buf_t *b, int argc, const char **argv, const size_t *lens) {
    char h[64]; int n = snprintf(h, sizeof h, "*%d\r\n", argc); buf_append(b, h, (size_t)n);
    for (int i = 0; i < argc; i++) {
        size_t l = lens ? lens[i] : strlen(argv[i]);
        n = snprintf(h, sizeof h, "$%zu\r\n", l); buf_append(b, h, (size_t)n);
        buf_append(b, argv[i], l); buf_append(b, "\r\n", 2);
    }
}

/* Pre-encodes the action a client sends to topic t. */
static void encode_action(buf_t *b, uint32_t t) {
    uint8_t payload[256]; memset(payload, 'a', sizeof payload);
    char ch[32];
    switch (sys_id) {
    case SYS_RELAY: {
        uint8_t body[128]; memset(body, 'a', sizeof body); body[0] = 'A'; memcpy(body + 1, &t, 4);
        frame_be(b, body, action_size);
        break;
    }
    case SYS_FLUX: {
        /* {"op":"dispatch","type":"bT/act","payload":{"pad":"aaa…"}} with a 100-byte payload */
        char body[512]; int n = snprintf(body, sizeof body, "{\"op\":\"dispatch\",\"type\":\"b%u/act\",\"payload\":{\"pad\":\"", t);
        size_t padn = action_size - 10; /* {"pad":"" + "} = 10 bytes around the pad */
        memset(body + n, 'a', padn); n += (int)padn;
        memcpy(body + n, "\"}}", 3); n += 3;
        frame_be(b, body, (size_t)n);
        break;
    }
    case SYS_REDIS: {
        snprintf(ch, sizeof ch, "a.%u", t);
        if (redis_write) { /* the action appended to a stream (the AOF holds every action), then published */
            const char *xv[5] = {"XADD", ch, "*", "p", (const char *)payload};
            size_t xl[5] = {4, strlen(ch), 1, 1, action_size};
            redis_cmd(b, 5, xv, xl);
        }
        const char *argv[3] = {"PUBLISH", ch, (const char *)payload};
        size_t lens[3] = {7, strlen(ch), action_size};
        redis_cmd(b, 3, argv, lens);
        break;
    }
    case SYS_MQTT:
        snprintf(ch, sizeof ch, "a/%u", t);
        mqtt_publish(b, ch, payload, action_size);
        break;
    case SYS_NATS: {
        char h[64]; int n = snprintf(h, sizeof h, "PUB a.%u %zu\r\n", t, action_size);
        buf_append(b, h, (size_t)n); buf_append(b, payload, action_size); buf_append(b, "\r\n", 2);
        break;
    }
    }
}

/* The store's reply template for one topic: encoded once, then the counter (and seq) patched in place. */
typedef struct { buf_t frame; size_t counter_at; size_t seq_at; int width; size_t set_counter_at; } tmpl_t;

static void encode_state_template(tmpl_t *tp, uint32_t t) {
    buf_t *b = &tp->frame; b->len = b->pos = 0;
    tp->width = 10;
    uint8_t *pl = malloc(state_size + 64);
    memset(pl, 's', state_size);
    char ch[32];
    switch (sys_id) {
    case SYS_RELAY: {
        pl[0] = 'S'; memcpy(pl + 1, &t, 4); put_dec_zero(pl + 5, 10, 0);
        frame_be(b, pl, state_size); tp->counter_at = 4 + 5; tp->seq_at = 0;
        break;
    }
    case SYS_FLUX: {
        /* {"op":"done","store":"bT","seq":<20>,"state":{"n":<20>,"pad":"sss…"}}; the state is state_size bytes */
        tp->width = 20;
        char head[128]; int hn = snprintf(head, sizeof head, "{\"op\":\"done\",\"store\":\"b%u\",\"seq\":", t);
        size_t fixed = 5 + 20 + 9 + 2; /* {"n": + digits + ,"pad":" + "} */
        size_t padn = state_size > fixed ? state_size - fixed : 0;
        size_t n = (size_t)hn + 20 + 9 + fixed + padn + 1;
        uint8_t *body = malloc(n + 8); size_t k = 0;
        memcpy(body, head, (size_t)hn); k = (size_t)hn;
        tp->seq_at = 4 + k; memset(body + k, ' ', 20); k += 20;
        memcpy(body + k, ",\"state\":", 9); k += 9;
        memcpy(body + k, "{\"n\":", 5); k += 5;
        tp->counter_at = 4 + k; memset(body + k, ' ', 20); body[k] = '0'; k += 20;
        memcpy(body + k, ",\"pad\":\"", 8); k += 8;
        memset(body + k, 's', padn); k += padn;
        memcpy(body + k, "\"}}", 3); k += 3;
        frame_be(b, body, k); free(body);
        break;
    }
    case SYS_REDIS: {
        snprintf(ch, sizeof ch, "s.%u", t);
        if (redis_write) { /* the state kept (SET, like fluxd's journaled snapshot), then published */
            const char *sv[3] = {"SET", ch, (const char *)pl};
            size_t sl[3] = {3, strlen(ch), state_size};
            redis_cmd(b, 3, sv, sl);
            tp->set_counter_at = b->len - 2 - state_size;
        }
        const char *argv[3] = {"PUBLISH", ch, (const char *)pl};
        size_t lens[3] = {7, strlen(ch), state_size};
        redis_cmd(b, 3, argv, lens);
        tp->counter_at = b->len - 2 - state_size; tp->seq_at = 0;
        break;
    }
    case SYS_MQTT:
        snprintf(ch, sizeof ch, "s/%u", t);
        mqtt_publish(b, ch, pl, state_size);
        tp->counter_at = b->len - state_size; tp->seq_at = 0;
        break;
    case SYS_NATS: {
        char h[64]; int n = snprintf(h, sizeof h, "PUB s.%u %zu\r\n", t, state_size);
        buf_append(b, h, (size_t)n); buf_append(b, pl, state_size); buf_append(b, "\r\n", 2);
        tp->counter_at = (size_t)n; tp->seq_at = 0;
        break;
    }
    }
    free(pl);
}

/* ------------------------------------------------------------------ handshakes (blocking) */

static void write_all_blocking(int fd, buf_t *b) {
    set_block(fd);
    while (b->pos < b->len) {
        ssize_t n = write(fd, b->data + b->pos, b->len - b->pos);
        if (n < 0) { if (errno == EINTR) continue; die("write"); }
        b->pos += (size_t)n;
    }
    b->pos = b->len = 0;
}

/* Reads until `need` messages of kind `kind` arrived (other messages are dropped). */
static void wait_for(conn_t *c, int kind, int need) {
    set_block(c->fd);
    msg_t m;
    while (need > 0) {
        while (need > 0 && next_msg(c, &m)) if (m.kind == kind) need--;
        if (c->dirty) { write_all_blocking(c->fd, &c->out); c->dirty = 0; }
        if (need <= 0) break;
        buf_reserve(&c->in, 65536);
        ssize_t n = read(c->fd, c->in.data + c->in.len, c->in.cap - c->in.len);
        if (n == 0) { fprintf(stderr, "%s: connection closed during handshake\n", sys_name); exit(2); }
        if (n < 0) { if (errno == EINTR) continue; die("read handshake"); }
        c->in.len += (size_t)n;
    }
}

static conn_t *open_conn(void) {
    conn_t *c = calloc(1, sizeof *c);
    c->fd = dial(addr); c->driver = -1;
    return c;
}

/* A client connection, subscribed to `ntopics` topics starting at `first` (0 = none). */
static conn_t *client_conn(uint32_t first, uint32_t ntopics, int idx) {
    conn_t *c = open_conn();
    buf_t *o = &c->out; char s[160]; uint8_t body[16];
    switch (sys_id) {
    case SYS_RELAY:
        for (uint32_t i = 0; i < (ntopics ? ntopics : 1); i++) {
            uint32_t t = ntopics ? first + i : 0xFFFFFFFFu;
            body[0] = 'H'; memcpy(body + 1, &t, 4); body[5] = 'C'; frame_be(o, body, 6);
        }
        body[0] = 'P'; memset(body + 1, 0, 4); frame_be(o, body, 5);
        write_all_blocking(c->fd, o); wait_for(c, M_READY, 1);
        break;
    case SYS_FLUX: {
        int n = snprintf(s, sizeof s, "{\"op\":\"hello\",\"protocol\":1,\"role\":\"client\",\"name\":\"bench%d\"}", idx);
        frame_be(o, s, (size_t)n);
        for (uint32_t i = 0; i < ntopics; i++) {
            n = snprintf(s, sizeof s, "{\"op\":\"subscribe\",\"store\":\"b%u\"}", first + i); frame_be(o, s, (size_t)n);
        }
        write_all_blocking(c->fd, o);
        wait_for(c, M_WELCOME, 1);
        /* `subscribed` says whether a retained snapshot follows; take its counter as this connection's base. */
        int subscribed = 0, snapshots = 0; msg_t m;
        set_block(c->fd);
        while (subscribed < (int)ntopics || snapshots > 0) {
            while (next_msg(c, &m)) {
                if (m.kind == M_READY) { subscribed++; if (m.seq > 0) snapshots++; }
                else if (m.kind == M_STATE) { snapshots--; if (m.counter > c->base) c->base = m.counter; }
            }
            if (subscribed >= (int)ntopics && snapshots <= 0) break;
            if (buf_read_fd(&c->in, c->fd) == 0) { fprintf(stderr, "flux: closed during subscribe\n"); exit(2); }
        }
        break;
    }
    case SYS_REDIS: {
        const char *hello[2] = {"HELLO", "3"}; redis_cmd(o, 2, hello, NULL);
        for (uint32_t i = 0; i < ntopics; i++) {
            snprintf(s, sizeof s, "s.%u", first + i);
            const char *sub[2] = {"SUBSCRIBE", s}; redis_cmd(o, 2, sub, NULL);
        }
        if (!ntopics) { const char *ping[1] = {"PING"}; redis_cmd(o, 1, ping, NULL); }
        write_all_blocking(c->fd, o); wait_for(c, M_READY, ntopics ? (int)ntopics : 1);
        break;
    }
    case SYS_MQTT:
        snprintf(s, sizeof s, "bench-c%d-%d", idx, (int)getpid()); mqtt_connect(o, s);
        for (uint32_t i = 0; i < ntopics; i++) { snprintf(s, sizeof s, "s/%u", first + i); mqtt_subscribe(o, s, (uint16_t)(i + 1)); }
        write_all_blocking(c->fd, o);
        wait_for(c, M_WELCOME, 1);
        if (ntopics) wait_for(c, M_READY, (int)ntopics);
        break;
    case SYS_NATS: {
        const char *cn = "CONNECT {\"verbose\":false,\"pedantic\":false,\"echo\":false}\r\n";
        buf_append(o, cn, strlen(cn));
        for (uint32_t i = 0; i < ntopics; i++) {
            int n = snprintf(s, sizeof s, "SUB s.%u %u\r\n", first + i, i + 1); buf_append(o, s, (size_t)n);
        }
        buf_append(o, "PING\r\n", 6);
        write_all_blocking(c->fd, o); wait_for(c, M_READY, 1);
        break;
    }
    }
    set_nonblock(c->fd);
    return c;
}

static conn_t *store_conn(uint32_t ntopics) {
    conn_t *c = open_conn();
    buf_t *o = &c->out; char s[160]; uint8_t body[16];
    switch (sys_id) {
    case SYS_RELAY:
        body[0] = 'H'; memset(body + 1, 0, 4); body[5] = 'E'; frame_be(o, body, 6);
        body[0] = 'P'; frame_be(o, body, 5);
        write_all_blocking(c->fd, o); wait_for(c, M_READY, 1);
        break;
    case SYS_FLUX: {
        int n = snprintf(s, sizeof s, "{\"op\":\"hello\",\"protocol\":1,\"role\":\"store\",\"name\":\"bench-store\"}");
        frame_be(o, s, (size_t)n);
        for (uint32_t i = 0; i < ntopics; i++) {
            n = snprintf(s, sizeof s, "{\"op\":\"register\",\"store\":\"b%u\",\"handles\":[\"b%u/*\"]}", i, i);
            frame_be(o, s, (size_t)n);
        }
        write_all_blocking(c->fd, o); wait_for(c, M_READY, (int)ntopics);
        break;
    }
    case SYS_REDIS: {
        const char *hello[2] = {"HELLO", "3"}; redis_cmd(o, 2, hello, NULL);
        for (uint32_t i = 0; i < ntopics; i++) {
            snprintf(s, sizeof s, "a.%u", i);
            const char *sub[2] = {"SUBSCRIBE", s}; redis_cmd(o, 2, sub, NULL);
        }
        write_all_blocking(c->fd, o); wait_for(c, M_READY, (int)ntopics);
        break;
    }
    case SYS_MQTT:
        snprintf(s, sizeof s, "bench-store-%d", (int)getpid()); mqtt_connect(o, s);
        for (uint32_t i = 0; i < ntopics; i++) { snprintf(s, sizeof s, "a/%u", i); mqtt_subscribe(o, s, (uint16_t)(i + 1)); }
        write_all_blocking(c->fd, o); wait_for(c, M_WELCOME, 1); wait_for(c, M_READY, (int)ntopics);
        break;
    case SYS_NATS: {
        const char *cn = "CONNECT {\"verbose\":false,\"pedantic\":false,\"echo\":false}\r\n";
        buf_append(o, cn, strlen(cn));
        for (uint32_t i = 0; i < ntopics; i++) {
            int n = snprintf(s, sizeof s, "SUB a.%u %u\r\n", i, i + 1); buf_append(o, s, (size_t)n);
        }
        buf_append(o, "PING\r\n", 6);
        write_all_blocking(c->fd, o); wait_for(c, M_READY, 1);
        break;
    }
    }
    return c;
}

/* ------------------------------------------------------------------ store */

static int run_store(uint32_t ntopics) {
    conn_t *c = store_conn(ntopics);
    tmpl_t *tp = calloc(ntopics, sizeof *tp);
    uint64_t *count = calloc(ntopics, sizeof *count);
    for (uint32_t t = 0; t < ntopics; t++) encode_state_template(&tp[t], t);
    printf("store ready\n"); fflush(stdout);
    set_block(c->fd);
    msg_t m;
    for (;;) {
        ssize_t n = buf_read_fd(&c->in, c->fd);
        if (n == 0) return 0;
        while (next_msg(c, &m)) {
            if (m.kind != M_ACTION || m.topic >= ntopics) continue;
            tmpl_t *p = &tp[m.topic];
            uint64_t k = ++count[m.topic];
            if (sys_id == SYS_FLUX) {
                put_dec_padded(p->frame.data + p->seq_at, 20, m.seq, ' ');
                put_dec_padded(p->frame.data + p->counter_at, 20, k, ' ');
            } else {
                put_dec_zero(p->frame.data + p->counter_at, 10, k);
                if (p->set_counter_at) put_dec_zero(p->frame.data + p->set_counter_at, 10, k);
            }
            buf_append(&c->out, p->frame.data, p->frame.len);
        }
        c->dirty = 0;
        if (buf_avail(&c->out)) write_all_blocking(c->fd, &c->out);
    }
}

/* ------------------------------------------------------------------ client */

typedef struct {
    conn_t *conn;          /* sends actions (and, with --subs 0, receives its own states) */
    conn_t **subs; int nsubs;
    uint64_t sent, done, target;
    uint64_t *sent_at;     /* ring of window size */
    int *reached;          /* ring: how many subscribers have counter >= k */
} driver_t;

static long rss_kb(int pid, const char *field) {
    if (pid <= 0) return -1;
    char path[64]; snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r"); if (!f) return -1;
    char line[256]; long v = -1; size_t fl = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':') { v = atol(line + fl + 1); break; }
    fclose(f); return v;
}

/* utime + stime of a process, in seconds (from /proc/PID/stat). */
static double cpu_secs(int pid) {
    if (pid <= 0) return -1;
    char path[64], line[1024]; snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r"); if (!f) return -1;
    size_t n = fread(line, 1, sizeof line - 1, f); fclose(f); line[n] = 0;
    char *p = strrchr(line, ')'); if (!p) return -1;
    unsigned long ut = 0, st = 0;
    /* fields after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b; return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) { fprintf(stderr, "usage: fluxbench store|client --sys S --addr A ...\n"); return 2; }
    const char *mode = argv[1];
    int clients = 1, nsubs = 0, window = 1, idle = 0, slow = 0, hold = 0, rss_pid = 0, store_pid = 0;
    uint32_t topics = 1; uint64_t count = 10000, warmup = 1000; double timeout = 300;
    const char *label = "";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--slow")) { slow = 1; continue; }
        if (!strcmp(a, "--hold")) { hold = 1; continue; }
        if (!strcmp(a, "--redis-write")) { redis_write = 1; continue; }
        if (!v) { fprintf(stderr, "missing value for %s\n", a); return 2; }
        i++;
        if (!strcmp(a, "--sys")) sys_name = v;
        else if (!strcmp(a, "--addr")) addr = v;
        else if (!strcmp(a, "--topics")) topics = (uint32_t)atoi(v);
        else if (!strcmp(a, "--state")) state_size = (size_t)atol(v);
        else if (!strcmp(a, "--clients")) clients = atoi(v);
        else if (!strcmp(a, "--subs")) nsubs = atoi(v);
        else if (!strcmp(a, "--window")) window = atoi(v);
        else if (!strcmp(a, "--count")) count = (uint64_t)atoll(v);
        else if (!strcmp(a, "--warmup")) warmup = (uint64_t)atoll(v);
        else if (!strcmp(a, "--idle")) idle = atoi(v);
        else if (!strcmp(a, "--rss-pid")) rss_pid = atoi(v);
        else if (!strcmp(a, "--store-pid")) store_pid = atoi(v);
        else if (!strcmp(a, "--timeout")) timeout = atof(v);
        else if (!strcmp(a, "--label")) label = v;
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
    }
    const char *names[] = {"relay", "flux", "redis", "mqtt", "nats"};
    for (int i = 0; i < 5; i++) if (sys_name && !strcmp(sys_name, names[i])) sys_id = i;
    if (sys_id < 0 || !addr) { fprintf(stderr, "need --sys relay|flux|redis|mqtt|nats and --addr\n"); return 2; }
    if (redis_write && sys_id != SYS_REDIS) { fprintf(stderr, "--redis-write needs --sys redis\n"); return 2; }
    if (!strcmp(mode, "store")) return run_store(topics);

    alarm((unsigned)timeout + 10); /* bounds the blocking handshakes too */
    if (nsubs > 0 && clients != 1) { fprintf(stderr, "--subs needs --clients 1\n"); return 2; }
    struct rlimit rl; getrlimit(RLIMIT_NOFILE, &rl); rl.rlim_cur = rl.rlim_max; setrlimit(RLIMIT_NOFILE, &rl);

    long rss_start = rss_kb(rss_pid, "VmRSS");
    /* Idle connections first (workload 5): handshake done, then never used. */
    conn_t **idlec = calloc((size_t)idle + 1, sizeof *idlec);
    for (int i = 0; i < idle; i++) idlec[i] = client_conn(0, 0, 100000 + i);
    long rss_idle = rss_kb(rss_pid, "VmRSS");
    if (hold) { /* keep the idle connections open until killed (profile.sh) */
        printf("idle ready\n"); fflush(stdout);
        alarm(0);
        for (;;) pause();
    }

    int ep = epoll_create1(EPOLL_CLOEXEC);
    driver_t *d = calloc((size_t)clients, sizeof *d);
    for (int i = 0; i < clients; i++) {
        driver_t *dr = &d[i];
        dr->target = warmup + count;
        dr->sent_at = calloc((size_t)window, sizeof(uint64_t));
        dr->reached = calloc((size_t)window, sizeof(int));
        if (nsubs == 0) {
            dr->conn = client_conn((uint32_t)i, 1, i);
            dr->conn->driver = i;
            dr->nsubs = 1; dr->subs = calloc(1, sizeof(conn_t *)); dr->subs[0] = dr->conn;
        } else {
            dr->conn = client_conn(0, 0, i);
            dr->nsubs = nsubs; dr->subs = calloc((size_t)nsubs, sizeof(conn_t *));
            for (int s = 0; s < nsubs; s++) { dr->subs[s] = client_conn(0, 1, 1000 + s); dr->subs[s]->driver = i; }
        }
    }
    conn_t *slowc = NULL;
    if (slow) slowc = client_conn(0, (uint32_t)clients, 99999); /* subscribes to every topic, never reads */
    (void)slowc;
    /* Every connection that receives goes into epoll. */
    for (int i = 0; i < clients; i++) {
        conn_t *all[1]; (void)all;
        if (nsubs == 0) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = d[i].conn};
            epoll_ctl(ep, EPOLL_CTL_ADD, d[i].conn->fd, &ev);
        } else {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = d[i].conn};
            epoll_ctl(ep, EPOLL_CTL_ADD, d[i].conn->fd, &ev);
            for (int s = 0; s < nsubs; s++) {
                struct epoll_event sev = {.events = EPOLLIN, .data.ptr = d[i].subs[s]};
                epoll_ctl(ep, EPOLL_CTL_ADD, d[i].subs[s]->fd, &sev);
            }
        }
    }

    buf_t *action = calloc((size_t)clients, sizeof(buf_t));
    for (int i = 0; i < clients; i++) encode_action(&action[i], nsubs ? 0u : (uint32_t)i);

    uint64_t total_samples = (uint64_t)clients * count;
    uint64_t *samples = malloc(sizeof(uint64_t) * (total_samples + 1)); uint64_t ns = 0;
    uint64_t deliveries = 0, warm_deliveries = 0;
    uint64_t t0 = now_ns(), t_warm = 0, t_end = 0, deadline = t0 + (uint64_t)(timeout * 1e9);
    uint64_t warm_total = (uint64_t)clients * warmup, all_done = 0, finished = 0;
    double cpu_warm = cpu_secs(rss_pid), cpu_end = -1;
    /* The store's and this process's CPU over the same measured part (where a round trip's CPU goes). */
    double store_warm = cpu_secs(store_pid), store_end = -1, self_warm = cpu_secs(getpid()), self_end = -1;
    if (warm_total == 0) t_warm = t0;

    /* Fill each window. */
    for (int i = 0; i < clients; i++) {
        driver_t *dr = &d[i];
        uint64_t now = now_ns();
        while (dr->sent - dr->done < (uint64_t)window && dr->sent < dr->target) {
            dr->sent++;
            dr->sent_at[dr->sent % (uint64_t)window] = now;
            dr->reached[dr->sent % (uint64_t)window] = 0;
            buf_append(&dr->conn->out, action[i].data, action[i].len);
        }
        buf_flush_fd(&dr->conn->out, dr->conn->fd);
    }

    struct epoll_event evs[512]; msg_t m;
    while (finished < (uint64_t)clients) {
        int k = epoll_wait(ep, evs, 512, 1000);
        if (k < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
        uint64_t now = now_ns();
        if (now > deadline) {
            fprintf(stderr, "fluxbench: timeout after %.0f s (%s %s)\n", timeout, sys_name, label);
            printf("{\"error\":\"timeout\"}\n"); return 3;
        }
        for (int e = 0; e < k; e++) {
            conn_t *c = evs[e].data.ptr;
            for (;;) {
                ssize_t n = buf_read_fd(&c->in, c->fd);
                if (n == 0) { fprintf(stderr, "%s: connection closed by broker\n", sys_name); printf("{\"error\":\"closed\"}\n"); return 3; }
                if (n < 0) break;
                while (next_msg(c, &m)) {
                    if (m.kind != M_STATE || c->driver < 0) continue;
                    deliveries++;
                    m.counter = m.counter > c->base ? m.counter - c->base : 0;
                    if (m.counter <= c->latest) continue;
                    driver_t *dr = &d[c->driver];
                    uint64_t from = c->latest; c->latest = m.counter;
                    for (uint64_t j = from + 1; j <= m.counter && j <= dr->sent; j++) {
                        if (++dr->reached[j % (uint64_t)window] < dr->nsubs) continue;
                        /* round j is complete: every subscriber has it */
                        dr->done = j;
                        if (j > warmup && ns < total_samples) samples[ns++] = now - dr->sent_at[j % (uint64_t)window];
                        all_done++;
                        if (all_done == warm_total) {
                            t_warm = now; warm_deliveries = deliveries; cpu_warm = cpu_secs(rss_pid);
                            store_warm = cpu_secs(store_pid); self_warm = cpu_secs(getpid());
                        }
                        if (j == dr->target) { finished++; t_end = now; }
                    }
                }
                if (c->dirty) { buf_flush_fd(&c->out, c->fd); c->dirty = 0; }
                if ((size_t)n < 65536) break;
            }
        }
        /* Refill windows and send (one write per connection per iteration). */
        for (int i = 0; i < clients; i++) {
            driver_t *dr = &d[i];
            int added = 0;
            while (dr->sent - dr->done < (uint64_t)window && dr->sent < dr->target) {
                dr->sent++;
                dr->sent_at[dr->sent % (uint64_t)window] = now;
                dr->reached[dr->sent % (uint64_t)window] = 0;
                buf_append(&dr->conn->out, action[i].data, action[i].len);
                added = 1;
            }
            if (added || buf_avail(&dr->conn->out)) buf_flush_fd(&dr->conn->out, dr->conn->fd);
        }
    }
    cpu_end = cpu_secs(rss_pid); store_end = cpu_secs(store_pid); self_end = cpu_secs(getpid());
    qsort(samples, ns, sizeof(uint64_t), cmp_u64);
    double secs = (double)(t_end - t_warm) / 1e9;
    uint64_t rounds = (uint64_t)clients * count;
    uint64_t dl = deliveries - warm_deliveries;
#define PCT(q) (ns ? (double)samples[(size_t)((double)(ns - 1) * (q))] / 1000.0 : 0.0)
    double sum = 0; for (uint64_t i = 0; i < ns; i++) sum += (double)samples[i];
    printf("{\"label\":\"%s\",\"sys\":\"%s\",\"clients\":%d,\"subs\":%d,\"window\":%d,\"state\":%zu,\"idle\":%d,\"slow\":%d,"
           "\"rounds\":%llu,\"secs\":%.4f,\"rounds_per_s\":%.1f,\"deliveries\":%llu,\"deliveries_per_s\":%.1f,"
           "\"state_mb_per_s\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f,\"mean_us\":%.2f,"
           "\"broker_rss_start_kb\":%ld,\"broker_rss_idle_kb\":%ld,\"broker_rss_end_kb\":%ld,\"broker_hwm_kb\":%ld,"
           "\"broker_cpu_us_per_round\":%.2f,\"store_cpu_us_per_round\":%.2f,\"client_cpu_us_per_round\":%.2f}\n",
           label, sys_name, clients, nsubs, window, state_size, idle, slow,
           (unsigned long long)rounds, secs, (double)rounds / secs, (unsigned long long)dl, (double)dl / secs,
           (double)dl * (double)state_size / secs / 1e6, PCT(0.50), PCT(0.99), PCT(0.999),
           ns ? (double)samples[ns - 1] / 1000.0 : 0.0, ns ? sum / (double)ns / 1000.0 : 0.0,
           rss_start, rss_idle, rss_kb(rss_pid, "VmRSS"), rss_kb(rss_pid, "VmHWM"),
           cpu_warm >= 0 && cpu_end >= 0 ? (cpu_end - cpu_warm) * 1e6 / (double)rounds : -1.0,
           store_warm >= 0 && store_end >= 0 ? (store_end - store_warm) * 1e6 / (double)rounds : -1.0,
           self_warm >= 0 && self_end >= 0 ? (self_end - self_warm) * 1e6 / (double)rounds : -1.0);
    return 0;
}
