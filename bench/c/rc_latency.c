/* rc_latency: rocebus-bench's rc-latency ping-pong, through the C API
 * (rocebus.h), for `cargo xtask bench rc-latency --api c`.
 *
 *   rc_latency IP:PORT [-s SIZE] [-n ITERATIONS] [--cores A,B]
 *   rc_latency --ping IP:PORT [-s SIZE] [-n ITERATIONS]
 *
 * The same shape as the Rust harness (bench/src/rc.rs, `latency`): both
 * ends in one process, a listener thread echoing on core B, the main thread
 * on core A sending SIZE bytes on stream 1 (offer_and_flush) and polling for
 * the echo with a fragment limit of 1; one-way latency is RTT/2, after a
 * warm-up of max(N/10, 100) round trips. The same ring size and payload
 * limit as the Rust harness. Prints the Rust harness's RESULT line (exact
 * percentiles of the sorted samples), which xtask parses.
 *
 * --ping: only the client, connected to `rocebus-bench rc-pong` at IP:PORT,
 * the C twin of `rocebus-bench rc-ping` for `cargo xtask bench
 * rc-instructions --api c` (which runs both under callgrind): the same loop
 * with nothing else in it, no clock reads, no warm-up, no samples. */
#define _GNU_SOURCE
#include "rocebus.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ < 0) {                                                                   \
            fprintf(stderr, "rc_latency: %s failed: %s (%s)\n", #call,                   \
                    rocebus_status_name(rc_), rocebus_last_error());                     \
            exit(2);                                                                     \
        }                                                                                \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void pin(int core) {
    if (core < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
        fprintf(stderr, "warning: could not pin to core %d\n", core);
}

/* The echo's one-frame copy (the frame's pointer is valid only in the handler). */
struct echo {
    size_t len;
    uint8_t buf[4096];
};

static void copy(void *clientd, const rocebus_frame_t *f) {
    struct echo *e = clientd;
    e->len = f->len;
    memcpy(e->buf, f->payload, f->len);
}

static void drop(void *clientd, const rocebus_frame_t *f) { (void)clientd, (void)f; }

struct server {
    rocebus_orders_listener_t *listener;
    int core;
};

static void *serve(void *arg) {
    struct server *s = arg;
    rocebus_orders_connection_t *c = NULL;
    CHECK(rocebus_orders_listener_accept(s->listener, 30000, &c));
    pin(s->core);
    struct echo *e = calloc(1, sizeof *e);
    if (!e) exit(2);
    for (;;) {
        int n = rocebus_orders_connection_poll(c, copy, e, 1);
        if (n == ROCEBUS_STATUS_PEER_LOST) break;
        CHECK(n);
        if (n == 1) {
            CHECK(rocebus_orders_connection_offer_and_flush(c, 2, 1, e->buf, e->len));
        }
    }
    free(e);
    CHECK(rocebus_orders_connection_free(c));
    return NULL;
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t at(const uint64_t *v, size_t n, double q) {
    size_t i = (size_t)(q * (double)n);
    return v[i < n ? i : n - 1];
}

/* The configuration of both harnesses (bench/src/rc.rs, `config`). Under
 * callgrind the handshake runs some 50 times slower: --ping allows for it,
 * as rc-ping does. */
static rocebus_orders_config_t *config(int ping) {
    rocebus_orders_config_t *cfg = NULL;
    CHECK(rocebus_orders_config_from_toml(
        ping ? "[orders]\ntoken = \"bench\"\nring_size = 1048576\nmax_payload = 4096\n"
               "connect_timeout_ms = 30000\n"
             : "[orders]\ntoken = \"bench\"\nring_size = 1048576\nmax_payload = 4096\n",
        &cfg));
    return cfg;
}

/* --ping's measured loop, as rc-ping's `ping_loop`: offer and flush one
 * message, poll until its echo arrives; returns the empty polls. */
static __attribute__((noinline)) long ping_loop(rocebus_orders_connection_t *c,
                                                const uint8_t *msg, size_t size, long n) {
    long empty = 0;
    for (long i = 0; i < n; i++) {
        CHECK(rocebus_orders_connection_offer_and_flush(c, 1, 1, msg, size));
        int got;
        while ((got = rocebus_orders_connection_poll(c, drop, NULL, 1)) == 0) empty++;
        CHECK(got);
    }
    return empty;
}

static int ping(const char *addr, size_t size, long iterations) {
    rocebus_orders_config_t *cfg = config(1);
    rocebus_orders_connection_t *c = NULL;
    CHECK(rocebus_orders_connect(cfg, addr, &c));
    rocebus_orders_config_free(cfg);
    uint8_t *msg = malloc(size);
    if (!msg) return 2;
    memset(msg, 0x5a, size);
    long empty = ping_loop(c, msg, size, iterations);
    rocebus_orders_stats_t st;
    CHECK(rocebus_orders_connection_stats(c, &st));
    CHECK(rocebus_orders_connection_free(c));
    free(msg);
    printf("rc_latency --ping: %ld round trips of %zu B, %ld empty polls, %llu frames received, "
           "%llu flushes\n",
           iterations, size, empty, (unsigned long long)st.frames_received,
           (unsigned long long)st.flushes);
    printf("RESULT round_trips=%ld empty_polls=%ld\n", iterations, empty);
    return 0;
}

int main(int argc, char **argv) {
    int ping_only = argc > 1 && !strcmp(argv[1], "--ping");
    if (ping_only) argv++, argc--;
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr,
                "usage: rc_latency IP:PORT [-s SIZE] [-n ITERATIONS] [--cores A,B]\n"
                "       rc_latency --ping IP:PORT [-s SIZE] [-n ITERATIONS]\n");
        return 1;
    }
    size_t size = 64;
    long iterations = 5000;
    int cores[2] = {-1, -1};
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            size = (size_t)atol(argv[++i]);
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            iterations = atol(argv[++i]);
        } else if (!strcmp(argv[i], "--cores") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d,%d", &cores[0], &cores[1]) != 2) {
                fprintf(stderr, "rc_latency: --cores takes A,B\n");
                return 1;
            }
        } else {
            fprintf(stderr, "rc_latency: unknown argument %s\n", argv[i]);
            return 1;
        }
    }
    if (size < 1 || size > 4096 || iterations < 1) {
        fprintf(stderr, "rc_latency: -s is 1 to 4096, -n at least 1\n");
        return 1;
    }
    if (ping_only) return ping(argv[1], size, iterations);
    rocebus_orders_config_t *cfg = config(0);
    struct server s = {.core = cores[1]};
    CHECK(rocebus_orders_listener_bind(cfg, argv[1], &s.listener));
    pthread_t t;
    if (pthread_create(&t, NULL, serve, &s) != 0) return 2;
    rocebus_orders_connection_t *c = NULL;
    CHECK(rocebus_orders_connect(cfg, argv[1], &c));
    rocebus_orders_config_free(cfg);
    pin(cores[0]);

    uint8_t *msg = malloc(size);
    long warmup = iterations / 10 > 100 ? iterations / 10 : 100;
    uint64_t *v = malloc(sizeof *v * (size_t)iterations);
    if (!msg || !v) return 2;
    memset(msg, 0x5a, size);
    for (long i = 0; i < warmup + iterations; i++) {
        uint64_t t0 = now_ns();
        CHECK(rocebus_orders_connection_offer_and_flush(c, 1, 1, msg, size));
        int n;
        while ((n = rocebus_orders_connection_poll(c, drop, NULL, 1)) == 0) {
        }
        CHECK(n);
        uint64_t half = (now_ns() - t0) / 2;
        if (i >= warmup) v[i - warmup] = half > 0 ? half : 1;
    }
    rocebus_orders_stats_t st;
    CHECK(rocebus_orders_connection_stats(c, &st));
    CHECK(rocebus_orders_connection_free(c));
    if (pthread_join(t, NULL) != 0) return 2;
    CHECK(rocebus_orders_listener_free(s.listener));

    size_t n = (size_t)iterations;
    qsort(v, n, sizeof *v, cmp);
    printf("rc-latency --api c: %zu B, %ld round trips, one-way (RTT/2)\n", size, iterations);
    printf("client: %llu frames sent, %llu received, %llu flushes\n",
           (unsigned long long)st.frames_sent, (unsigned long long)st.frames_received,
           (unsigned long long)st.flushes);
    printf("RESULT p50_ns=%llu p90_ns=%llu p99_ns=%llu p999_ns=%llu max_ns=%llu count=%zu\n",
           (unsigned long long)at(v, n, 0.50), (unsigned long long)at(v, n, 0.90),
           (unsigned long long)at(v, n, 0.99), (unsigned long long)at(v, n, 0.999),
           (unsigned long long)v[n - 1], n);
    free(v);
    free(msg);
    return 0;
}
