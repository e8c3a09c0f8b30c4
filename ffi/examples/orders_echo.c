/* orders_echo: an orders connection over RDMA through the C API, both ends
 * in one process (a listener thread echoes), every byte checked.
 *
 *   orders_echo IP:PORT [ROUND_TRIPS]
 *
 * The main thread connects to a listener bound at IP:PORT (an address of
 * an RDMA device) and sends ROUND_TRIPS messages, a third each by
 * rocebus_orders_connection_offer, try_claim/commit and offer_and_flush, on streams 1
 * and 2, each flushed; every 10th round it also claims a frame and aborts
 * it, which must never arrive. The listener's thread polls with a fragment
 * limit, copies the frames (their pointers are valid only inside the
 * handler), and answers each with its type plus one on the same stream.
 * It also checks the run-time rules the Rust borrow checker enforces at
 * compile time: nothing but commit/abort while a claim is open, no poll
 * from inside the connection's own handler. Exit status 0 and a last line
 * "orders_echo: N round trips ok" when all held; run in the soft-RoCE guest
 * by ffi/tests/c_examples.rs. */
#define _POSIX_C_SOURCE 200809L
#include "rocebus.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TYPE_ABORTED 14
#define TYPE_STOP 99
#define MAX_PAYLOAD 512
#define LIMIT 8

#define CHECK(call)                                                                      \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ < 0) {                                                                   \
            fprintf(stderr, "orders_echo: %s failed: %s (%s)\n", #call,                  \
                    rocebus_status_name(rc_), rocebus_last_error());                     \
            exit(2);                                                                     \
        }                                                                                \
    } while (0)

#define EXPECT(cond, ...)                                                                \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "orders_echo: ");                                            \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
            exit(3);                                                                     \
        }                                                                                \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t fill(uint8_t *buf, uint64_t i) {
    size_t len = 8 + (size_t)(i * 53 % 300);
    memcpy(buf, &i, 8);
    for (size_t k = 8; k < len; k++) buf[k] = (uint8_t)(i * 13 + k);
    return len;
}

/* Frames a handler copied out (their pointers die with the call). */
struct inbox {
    int count;
    rocebus_frame_t frame[LIMIT]; /* payload pointers cleared: see data */
    uint8_t data[LIMIT][MAX_PAYLOAD];
    rocebus_orders_connection_t *self; /* to try a re-entrant poll once */
    int reentry_checked;
};

static void noop(void *clientd, const rocebus_frame_t *f) { (void)clientd, (void)f; }

static void keep(void *clientd, const rocebus_frame_t *f) {
    struct inbox *in = clientd;
    if (in->self && !in->reentry_checked) {
        int rc = rocebus_orders_connection_poll(in->self, noop, NULL, 1);
        EXPECT(rc == ROCEBUS_STATUS_BUSY, "re-entrant poll gave %s", rocebus_status_name(rc));
        in->reentry_checked = 1;
    }
    EXPECT(in->count < LIMIT, "more frames than the fragment limit");
    EXPECT(f->len <= MAX_PAYLOAD, "frame of %zu bytes", f->len);
    in->frame[in->count] = *f;
    in->frame[in->count].payload = NULL;
    memcpy(in->data[in->count], f->payload, f->len);
    in->count++;
}

/* Offers (claim 0), claims (1) or offers and flushes in one call (2), polling
 * while back-pressured; then flushes. */
static void send_frame(rocebus_orders_connection_t *c, uint16_t stream, uint16_t type,
                       const uint8_t *data, size_t len, int claim, double deadline) {
    for (;;) {
        int rc;
        if (claim == 2) {
            rc = rocebus_orders_connection_offer_and_flush(c, stream, type, data, len);
            if (rc == 0) break;
        } else if (claim) {
            uint8_t *buf = NULL;
            rc = rocebus_orders_connection_try_claim(c, stream, type, len, &buf);
            if (rc == 0) {
                memcpy(buf, data, len);
                CHECK(rocebus_orders_connection_commit(c));
                break;
            }
        } else {
            rc = rocebus_orders_connection_offer(c, stream, type, data, len);
            if (rc == 0) break;
        }
        EXPECT(rc == ROCEBUS_STATUS_BACK_PRESSURED, "send: %s (%s)", rocebus_status_name(rc),
               rocebus_last_error());
        EXPECT(now_s() < deadline, "back-pressured until the deadline");
        CHECK(rocebus_orders_connection_poll(c, noop, NULL, 0)); /* credit, completions */
    }
    CHECK(rocebus_orders_connection_flush(c));
}

struct server {
    rocebus_orders_listener_t *listener;
    int echoed;
};

static void *serve(void *arg) {
    struct server *s = arg;
    rocebus_orders_connection_t *c = NULL;
    CHECK(rocebus_orders_listener_accept(s->listener, 30000, &c));
    struct inbox *in = calloc(1, sizeof *in);
    EXPECT(in != NULL, "out of memory");
    double deadline = now_s() + 300; /* generous: valgrind in an emulated guest */
    for (;;) {
        in->count = 0;
        CHECK(rocebus_orders_connection_poll(c, keep, in, LIMIT));
        int stop = 0;
        for (int k = 0; k < in->count; k++) {
            rocebus_frame_t *f = &in->frame[k];
            EXPECT(f->msg_type != TYPE_ABORTED, "an aborted claim arrived");
            if (f->msg_type == TYPE_STOP) {
                stop = 1;
                break;
            }
            send_frame(c, f->stream_id, f->msg_type + 1, in->data[k], f->len, k % 2, deadline);
            s->echoed++;
        }
        if (stop) break;
        EXPECT(now_s() < deadline, "the client stopped sending");
    }
    free(in);
    CHECK(rocebus_orders_connection_free(c));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: orders_echo IP:PORT [ROUND_TRIPS]\n");
        return 1;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 500;
    rocebus_orders_config_t *cfg = NULL;
    /* A generous set-up timeout: the tests also run this under valgrind in an emulated
     * guest, where the handshake is some 50 times slower than natively. */
    CHECK(rocebus_orders_config_from_toml("[orders]\ntoken = \"c-example\"\nring_size = 65536\n"
                                          "max_payload = 512\nconnect_timeout_ms = 60000\n",
                                          &cfg));

    struct server s = {0};
    CHECK(rocebus_orders_listener_bind(cfg, argv[1], &s.listener));
    EXPECT(rocebus_orders_listener_local_port(s.listener) > 0, "no port");
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, serve, &s) == 0, "pthread_create");

    rocebus_orders_connection_t *c = NULL;
    CHECK(rocebus_orders_connect(cfg, argv[1], &c));
    rocebus_orders_config_free(cfg);

    /* The run-time rules of claims. */
    uint8_t *buf = NULL;
    uint8_t sent[MAX_PAYLOAD];
    int rc = rocebus_orders_connection_commit(c);
    EXPECT(rc == ROCEBUS_STATUS_NO_CLAIM, "commit without a claim gave %d", rc);
    CHECK(rocebus_orders_connection_try_claim(c, 1, TYPE_ABORTED, 8, &buf));
    rc = rocebus_orders_connection_offer(c, 1, 10, sent, 8);
    EXPECT(rc == ROCEBUS_STATUS_CLAIM_OPEN, "offer with a claim open gave %d", rc);
    rc = rocebus_orders_connection_flush(c);
    EXPECT(rc == ROCEBUS_STATUS_CLAIM_OPEN, "flush with a claim open gave %d", rc);
    rc = rocebus_orders_connection_poll(c, noop, NULL, 1);
    EXPECT(rc == ROCEBUS_STATUS_CLAIM_OPEN, "poll with a claim open gave %d", rc);
    CHECK(rocebus_orders_connection_abort(c));
    rc = rocebus_orders_connection_offer(c, 1, 0xFF00, sent, 8);
    EXPECT(rc == ROCEBUS_STATUS_RESERVED_TYPE, "a reserved type gave %d", rc);
    rc = rocebus_orders_connection_offer(c, 1, 10, sent, MAX_PAYLOAD + 1);
    EXPECT(rc == ROCEBUS_STATUS_TOO_LARGE, "a payload too large gave %d", rc);

    struct inbox *in = calloc(1, sizeof *in);
    EXPECT(in != NULL, "out of memory");
    in->self = c;
    double deadline = now_s() + 300; /* generous: valgrind in an emulated guest */
    uint64_t last_seq = 0;
    for (int i = 0; i < rounds; i++) {
        if (i % 10 == 5) {
            CHECK(rocebus_orders_connection_try_claim(c, 1, TYPE_ABORTED, 16, &buf));
            memset(buf, 0xAB, 16);
            CHECK(rocebus_orders_connection_abort(c));
        }
        size_t len = fill(sent, (uint64_t)i);
        uint16_t stream = (uint16_t)(1 + i % 2);
        uint16_t type = (uint16_t)(20 + 2 * (i % 3)); /* never TYPE_ABORTED */
        send_frame(c, stream, type, sent, len, i % 3, deadline);
        in->count = 0;
        while (in->count == 0) {
            CHECK(rocebus_orders_connection_poll(c, keep, in, LIMIT));
            EXPECT(now_s() < deadline, "round %d: no echo before the deadline", i);
        }
        EXPECT(in->count == 1, "round %d: %d frames", i, in->count);
        rocebus_frame_t *f = &in->frame[0];
        EXPECT(f->stream_id == stream && f->msg_type == type + 1,
               "round %d: stream %u type %u, sent stream %u type %u", i, f->stream_id,
               f->msg_type, stream, type);
        EXPECT(f->len == len && memcmp(in->data[0], sent, len) == 0,
               "round %d: the echo differs (%zu bytes, sent %zu)", i, f->len, len);
        EXPECT(i == 0 || f->seq > last_seq, "round %d: sequence %llu after %llu", i,
               (unsigned long long)f->seq, (unsigned long long)last_seq);
        last_seq = f->seq;
    }
    EXPECT(rounds == 0 || in->reentry_checked, "the re-entrant poll was not tried");
    send_frame(c, 1, TYPE_STOP, sent, 0, 0, deadline);
    EXPECT(pthread_join(t, NULL) == 0, "pthread_join");
    EXPECT(s.echoed == rounds, "the server echoed %d of %d", s.echoed, rounds);

    rocebus_orders_stats_t st;
    CHECK(rocebus_orders_connection_stats(c, &st));
    EXPECT(st.frames_sent == (uint64_t)rounds + 1 && st.frames_received == (uint64_t)rounds,
           "stats: %llu sent, %llu received", (unsigned long long)st.frames_sent,
           (unsigned long long)st.frames_received);
    free(in);
    CHECK(rocebus_orders_connection_free(c));
    CHECK(rocebus_orders_listener_free(s.listener));
    printf("orders_echo: %d round trips ok\n", rounds);
    return 0;
}
