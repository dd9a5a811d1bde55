/* dbusbench: the D-Bus baseline on a private bus: a method call round trip (100-byte byte array in, 200-byte
 * byte array out), the pattern D-Bus users would use for "dispatch and get the new state". libdbus owns the I/O,
 * so this is a separate program from fluxbench, with the same output JSON.
 *
 *   dbusbench service --addr unix:path=/tmp/x.sock
 *   dbusbench client  --addr unix:path=/tmp/x.sock [--clients C] [--window W] [--count K] [--warmup X] */
#include "common.h"
#include <dbus/dbus.h>
#include <poll.h>

#define NAME "org.fluxbus.Bench"
#define PATH "/org/fluxbus/Bench"
#define IFACE "org.fluxbus.Bench"

static DBusConnection *bus_open(const char *addr) {
    DBusError err; dbus_error_init(&err);
    DBusConnection *c = dbus_connection_open_private(addr, &err);
    if (!c) { fprintf(stderr, "dbus open: %s\n", err.message); exit(2); }
    if (!dbus_bus_register(c, &err)) { fprintf(stderr, "dbus register: %s\n", err.message); exit(2); }
    return c;
}

static int run_service(const char *addr) {
    DBusConnection *c = bus_open(addr);
    DBusError err; dbus_error_init(&err);
    if (dbus_bus_request_name(c, NAME, DBUS_NAME_FLAG_DO_NOT_QUEUE, &err) != DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER) {
        fprintf(stderr, "dbus name: %s\n", err.message ? err.message : "not primary"); return 2;
    }
    unsigned char state[200]; memset(state, 's', sizeof state);
    const unsigned char *sp = state;
    uint64_t counter = 0;
    printf("service ready\n"); fflush(stdout);
    while (dbus_connection_read_write(c, -1)) {
        DBusMessage *m;
        while ((m = dbus_connection_pop_message(c))) {
            if (dbus_message_get_type(m) == DBUS_MESSAGE_TYPE_METHOD_CALL && dbus_message_has_member(m, "Act")) {
                put_dec_zero(state, 10, ++counter);
                DBusMessage *r = dbus_message_new_method_return(m);
                dbus_message_append_args(r, DBUS_TYPE_ARRAY, DBUS_TYPE_BYTE, &sp, (int)sizeof state, DBUS_TYPE_INVALID);
                dbus_connection_send(c, r, NULL);
                dbus_message_unref(r);
            }
            dbus_message_unref(m);
        }
        dbus_connection_flush(c);
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b; return x < y ? -1 : x > y;
}

typedef struct { DBusConnection *c; int fd; uint64_t sent, done, target; uint64_t *sent_at; } drv_t;

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: dbusbench service|client --addr A ...\n"); return 2; }
    const char *addr = NULL, *label = "";
    int clients = 1, window = 1; uint64_t count = 10000, warmup = 1000; double timeout = 300;
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--addr")) addr = v;
        else if (!strcmp(a, "--clients")) clients = atoi(v);
        else if (!strcmp(a, "--window")) window = atoi(v);
        else if (!strcmp(a, "--count")) count = (uint64_t)atoll(v);
        else if (!strcmp(a, "--warmup")) warmup = (uint64_t)atoll(v);
        else if (!strcmp(a, "--timeout")) timeout = atof(v);
        else if (!strcmp(a, "--label")) label = v;
    }
    if (!addr) { fprintf(stderr, "need --addr\n"); return 2; }
    if (!strcmp(argv[1], "service")) return run_service(addr);

    unsigned char action[100]; memset(action, 'a', sizeof action);
    const unsigned char *ap = action;
    DBusMessage *tmpl = dbus_message_new_method_call(NAME, PATH, IFACE, "Act");
    dbus_message_append_args(tmpl, DBUS_TYPE_ARRAY, DBUS_TYPE_BYTE, &ap, (int)sizeof action, DBUS_TYPE_INVALID);

    drv_t *d = calloc((size_t)clients, sizeof *d);
    struct pollfd *pfd = calloc((size_t)clients, sizeof *pfd);
    for (int i = 0; i < clients; i++) {
        d[i].c = bus_open(addr);
        dbus_connection_get_unix_fd(d[i].c, &d[i].fd);
        d[i].target = warmup + count;
        d[i].sent_at = calloc((size_t)window, sizeof(uint64_t));
        pfd[i].fd = d[i].fd; pfd[i].events = POLLIN;
    }
    uint64_t total = (uint64_t)clients * count, ns = 0, all_done = 0, warm_total = (uint64_t)clients * warmup;
    uint64_t *samples = malloc(sizeof(uint64_t) * (total + 1));
    uint64_t t0 = now_ns(), t_warm = warm_total ? 0 : t0, t_end = 0, deadline = t0 + (uint64_t)(timeout * 1e9);
    int finished = 0;
    for (;;) {
        uint64_t now = now_ns();
        for (int i = 0; i < clients; i++) {
            int added = 0;
            while (d[i].sent - d[i].done < (uint64_t)window && d[i].sent < d[i].target) {
                DBusMessage *m = dbus_message_copy(tmpl);
                dbus_connection_send(d[i].c, m, NULL);
                dbus_message_unref(m);
                d[i].sent_at[d[i].sent % (uint64_t)window] = now; d[i].sent++; added = 1;
            }
            if (added) dbus_connection_flush(d[i].c);
        }
        if (finished == clients) break;
        if (now > deadline) { fprintf(stderr, "dbusbench: timeout\n"); printf("{\"error\":\"timeout\"}\n"); return 3; }
        /* libdbus may already hold replies it read while flushing: poll only when none is queued. */
        int queued = 0;
        for (int i = 0; i < clients; i++)
            if (dbus_connection_get_dispatch_status(d[i].c) == DBUS_DISPATCH_DATA_REMAINS) queued = 1;
        if (!queued && poll(pfd, (nfds_t)clients, 1000) < 0 && errno != EINTR) die("poll");
        now = now_ns();
        for (int i = 0; i < clients; i++) {
            if (pfd[i].revents & POLLIN) dbus_connection_read_write(d[i].c, 0);
            pfd[i].revents = 0;
            DBusMessage *m;
            while ((m = dbus_connection_pop_message(d[i].c))) {
                if (dbus_message_get_type(m) == DBUS_MESSAGE_TYPE_METHOD_RETURN) {
                    uint64_t j = d[i].done++; /* replies come in call order from the one service */
                    if (j >= warmup && ns < total) samples[ns++] = now - d[i].sent_at[j % (uint64_t)window];
                    if (++all_done == warm_total) t_warm = now;
                    if (d[i].done == d[i].target) { finished++; t_end = now; }
                } else if (dbus_message_get_type(m) == DBUS_MESSAGE_TYPE_ERROR) {
                    fprintf(stderr, "dbus error reply: %s\n", dbus_message_get_error_name(m)); return 3;
                }
                dbus_message_unref(m);
            }
        }
    }
    qsort(samples, ns, sizeof(uint64_t), cmp_u64);
    double secs = (double)(t_end - t_warm) / 1e9, sum = 0;
    for (uint64_t i = 0; i < ns; i++) sum += (double)samples[i];
#define PCT(q) (ns ? (double)samples[(size_t)((double)(ns - 1) * (q))] / 1000.0 : 0.0)
    printf("{\"label\":\"%s\",\"sys\":\"dbus\",\"clients\":%d,\"subs\":0,\"window\":%d,\"state\":200,\"idle\":0,\"slow\":0,"
           "\"rounds\":%llu,\"secs\":%.4f,\"rounds_per_s\":%.1f,\"deliveries\":%llu,\"deliveries_per_s\":%.1f,"
           "\"state_mb_per_s\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,\"max_us\":%.2f,\"mean_us\":%.2f,"
           "\"broker_rss_start_kb\":-1,\"broker_rss_idle_kb\":-1,\"broker_rss_end_kb\":-1,\"broker_hwm_kb\":-1}\n",
           label, clients, window, (unsigned long long)total, secs, (double)total / secs, (unsigned long long)total,
           (double)total / secs, (double)total * 200.0 / secs / 1e6, PCT(0.50), PCT(0.99), PCT(0.999),
           ns ? (double)samples[ns - 1] / 1000.0 : 0.0, ns ? sum / (double)ns / 1000.0 : 0.0);
    return 0;
}
