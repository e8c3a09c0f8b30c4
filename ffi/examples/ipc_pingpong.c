/* ipc_pingpong: two processes exchange messages over rocebus ipc streams
 * through the C API, and check every byte that comes back.
 *
 *   ipc_pingpong DIR [ROUND_TRIPS]
 *
 * The parent publishes on "ping" and subscribes to "pong"; a forked child
 * does the opposite and echoes every message back with its type plus one.
 * Half the messages go by rocebus_ipc_publisher_offer (a copy), half by
 * try_claim/commit (written in place); every 10th round also claims a frame
 * and aborts it, which the child must never see. It also checks the
 * run-time rules the Rust borrow checker enforces at compile time: no offer
 * while a claim is open, no poll from inside the same subscriber's handler.
 * Exit status 0 and a last line "ipc_pingpong: N round trips ok" when all
 * held; run by ffi/tests/c_examples.rs under valgrind. */
#define _POSIX_C_SOURCE 200809L
#include "rocebus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TYPE_HELLO 1
#define TYPE_OFFERED 10
#define TYPE_CLAIMED 12
#define TYPE_ABORTED 14
#define TYPE_STOP 99
#define MAX_PAYLOAD 512

static const char *who = "parent";

#define CHECK(call)                                                                      \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ < 0) {                                                                   \
            fprintf(stderr, "ipc_pingpong %s: %s failed: %s (%s)\n", who, #call,         \
                    rocebus_status_name(rc_), rocebus_last_error());                     \
            exit(2);                                                                     \
        }                                                                                \
    } while (0)

#define EXPECT(cond, ...)                                                                \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "ipc_pingpong %s: ", who);                                   \
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

/* The payload of round i: its index, then bytes derived from it. */
static size_t fill(uint8_t *buf, uint64_t i) {
    size_t len = 8 + (size_t)(i * 37 % 200);
    memcpy(buf, &i, 8);
    for (size_t k = 8; k < len; k++) buf[k] = (uint8_t)(i * 31 + k);
    return len;
}

/* What a handler keeps: payload pointers are valid only inside the call,
 * so it copies. */
struct inbox {
    int count;
    uint16_t type[16];
    size_t len[16];
    uint8_t data[16][MAX_PAYLOAD];
    rocebus_ipc_subscriber_t *self; /* to try a re-entrant poll once */
    int reentry_checked;
};

static void noop(void *clientd, uint16_t msg_type, const uint8_t *payload, size_t len) {
    (void)clientd, (void)msg_type, (void)payload, (void)len;
}

static void keep(void *clientd, uint16_t msg_type, const uint8_t *payload, size_t len) {
    struct inbox *in = clientd;
    if (in->self && !in->reentry_checked) {
        /* Polling the subscriber from its own handler must be refused. */
        int rc = rocebus_ipc_subscriber_poll(in->self, rocebus_now_ns(), noop, NULL, 1);
        EXPECT(rc == ROCEBUS_STATUS_BUSY, "re-entrant poll gave %s", rocebus_status_name(rc));
        in->reentry_checked = 1;
    }
    EXPECT(in->count < 16, "more messages than the fragment limit");
    EXPECT(len <= MAX_PAYLOAD, "payload of %zu bytes", len);
    in->type[in->count] = msg_type;
    in->len[in->count] = len;
    memcpy(in->data[in->count], payload, len);
    in->count++;
}

/* Polls until one message arrives or the deadline passes. */
static void receive_one(rocebus_ipc_subscriber_t *sub, struct inbox *in, double deadline) {
    in->count = 0;
    while (in->count == 0) {
        CHECK(rocebus_ipc_subscriber_poll(sub, rocebus_now_ns(), keep, in, 1));
        EXPECT(now_s() < deadline, "no message before the deadline");
    }
}

static void publish(rocebus_ipc_publisher_t *pub, uint16_t type, const uint8_t *data,
                    size_t len, int claim, double deadline) {
    for (;;) {
        int rc;
        if (claim) {
            uint8_t *buf = NULL;
            rc = rocebus_ipc_publisher_try_claim(pub, type, len, &buf);
            if (rc == 0) {
                memcpy(buf, data, len);
                CHECK(rocebus_ipc_publisher_commit(pub));
                return;
            }
        } else {
            rc = rocebus_ipc_publisher_offer(pub, type, data, len);
            if (rc == 0) return;
        }
        EXPECT(rc == ROCEBUS_STATUS_BACK_PRESSURED, "publish: %s (%s)",
               rocebus_status_name(rc), rocebus_last_error());
        EXPECT(now_s() < deadline, "back-pressured until the deadline");
    }
}

static int child(rocebus_ipc_config_t *cfg) {
    who = "child";
    rocebus_ipc_publisher_t *pong = NULL;
    rocebus_ipc_subscriber_t *ping = NULL;
    CHECK(rocebus_ipc_publisher_new(cfg, "pong", &pong));
    CHECK(rocebus_ipc_subscriber_new(cfg, "ping", &ping));
    rocebus_ipc_config_free(cfg);
    struct inbox *in = calloc(1, sizeof *in);
    EXPECT(in != NULL, "out of memory");
    double deadline = now_s() + 60;
    int echoed = 0;
    for (;;) {
        receive_one(ping, in, deadline);
        EXPECT(in->type[0] != TYPE_ABORTED, "an aborted claim was delivered");
        if (in->type[0] == TYPE_STOP) break;
        /* Echo: offers answered by claims and claims by offers. */
        publish(pong, in->type[0] + 1, in->data[0], in->len[0], in->type[0] == TYPE_OFFERED,
                deadline);
        echoed++;
    }
    free(in);
    CHECK(rocebus_ipc_subscriber_free(ping));
    CHECK(rocebus_ipc_publisher_free(pong));
    return echoed > 0 ? 0 : 4;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ipc_pingpong DIR [ROUND_TRIPS]\n");
        return 1;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 1000;
    char toml[512];
    snprintf(toml, sizeof toml, "[ipc]\ndir = \"%s\"\nring_bytes = 65536\nmax_payload = %d\n",
             argv[1], MAX_PAYLOAD);
    rocebus_ipc_config_t *cfg = NULL;
    CHECK(rocebus_ipc_config_from_toml(toml, &cfg));

    /* A bad configuration is an error code with a message, not a crash. */
    rocebus_ipc_config_t *bad = NULL;
    int rc = rocebus_ipc_config_from_toml("ring_bytes = 1000", &bad);
    EXPECT(rc == ROCEBUS_STATUS_CONFIG && bad == NULL, "bad config gave %d", rc);
    EXPECT(strstr(rocebus_last_error(), "ring_bytes") != NULL, "message: %s",
           rocebus_last_error());

    /* Both processes create a stream in DIR at once: make DIR first (mode
     * 0700, as rocebus would), so that neither finds the other's mkdir. */
    EXPECT(mkdir(argv[1], 0700) == 0, "mkdir %s failed", argv[1]);
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork failed");
    if (pid == 0) exit(child(cfg));

    rocebus_ipc_publisher_t *ping = NULL;
    rocebus_ipc_subscriber_t *pong = NULL;
    CHECK(rocebus_ipc_publisher_new(cfg, "ping", &ping));
    CHECK(rocebus_ipc_subscriber_new(cfg, "pong", &pong));
    rocebus_ipc_config_free(cfg);
    struct inbox *in = calloc(1, sizeof *in);
    EXPECT(in != NULL, "out of memory");
    double deadline = now_s() + 60;

    /* Each side joins the other's stream at its newest frame: say hello
     * until an echo shows the child listens. */
    uint8_t hello[8] = {0};
    for (;;) {
        CHECK(rocebus_ipc_publisher_offer(ping, TYPE_HELLO, hello, sizeof hello));
        double until = now_s() + 0.05;
        in->count = 0;
        while (in->count == 0 && now_s() < until)
            CHECK(rocebus_ipc_subscriber_poll(pong, rocebus_now_ns(), keep, in, 1));
        if (in->count > 0) break;
        EXPECT(now_s() < deadline, "the child never answered");
    }
    rocebus_ipc_event_t ev;
    EXPECT(rocebus_ipc_subscriber_poll_event(pong, &ev) == 1 &&
               ev.kind == ROCEBUS_IPC_EVENT_KIND_CONNECTED && ev.publisher_pid == (uint32_t)pid,
           "no CONNECTED event naming the child");
    /* The run-time rules of claims. */
    uint8_t *buf = NULL;
    rc = rocebus_ipc_publisher_commit(ping);
    EXPECT(rc == ROCEBUS_STATUS_NO_CLAIM, "commit without a claim gave %d", rc);
    CHECK(rocebus_ipc_publisher_try_claim(ping, TYPE_ABORTED, 8, &buf));
    rc = rocebus_ipc_publisher_offer(ping, TYPE_OFFERED, hello, 8);
    EXPECT(rc == ROCEBUS_STATUS_CLAIM_OPEN, "offer with a claim open gave %d", rc);
    rc = rocebus_ipc_publisher_try_claim(ping, TYPE_OFFERED, 8, &buf);
    EXPECT(rc == ROCEBUS_STATUS_CLAIM_OPEN, "a second claim gave %d", rc);
    CHECK(rocebus_ipc_publisher_abort(ping));
    rc = rocebus_ipc_publisher_offer(ping, 0xFF00, hello, 8);
    EXPECT(rc == ROCEBUS_STATUS_RESERVED_TYPE, "a reserved type gave %d", rc);
    rc = rocebus_ipc_publisher_offer(ping, TYPE_OFFERED, hello, MAX_PAYLOAD + 1);
    EXPECT(rc == ROCEBUS_STATUS_TOO_LARGE, "a payload too large gave %d", rc);

    uint8_t sent[MAX_PAYLOAD];
    in->self = pong;
    for (int i = 0; i < rounds; i++) {
        if (i % 10 == 5) {
            CHECK(rocebus_ipc_publisher_try_claim(ping, TYPE_ABORTED, 16, &buf));
            memset(buf, 0xAB, 16);
            CHECK(rocebus_ipc_publisher_abort(ping));
        }
        size_t len = fill(sent, (uint64_t)i);
        int claim = i % 2;
        uint16_t type = claim ? TYPE_CLAIMED : TYPE_OFFERED;
        publish(ping, type, sent, len, claim, deadline);
        /* Echoes of the later hellos may still come first: skip them. */
        do receive_one(pong, in, deadline);
        while (in->type[0] == TYPE_HELLO + 1);
        EXPECT(in->type[0] == type + 1, "round %d: type %u, sent %u", i, in->type[0], type);
        EXPECT(in->len[0] == len && memcmp(in->data[0], sent, len) == 0,
               "round %d: the echo differs (%zu bytes, sent %zu)", i, in->len[0], len);
    }
    EXPECT(rounds == 0 || in->reentry_checked, "the re-entrant poll was not tried");
    publish(ping, TYPE_STOP, hello, 0, 0, deadline);

    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid, "waitpid");
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);
    free(in);
    CHECK(rocebus_ipc_subscriber_free(pong));
    CHECK(rocebus_ipc_publisher_free(ping));
    printf("ipc_pingpong: %d round trips ok\n", rounds);
    return 0;
}
