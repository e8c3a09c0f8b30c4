// ipc_cpp: the C++17 wrapper (rocebus.hpp) over an ipc stream, one process:
// RAII handles, lambdas as handlers, span payloads, RAII claims, errors as
// exceptions for set-up and as statuses on the per-message path.
//
//   ipc_cpp DIR
//
// Exit status 0 and a last line "ipc_cpp: ok" when every check held; run by
// ffi/tests/c_examples.rs under valgrind.
#include "rocebus.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#define EXPECT(cond)                                                                   \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            std::fprintf(stderr, "ipc_cpp: line %d: %s\n", __LINE__, #cond);           \
            std::exit(3);                                                              \
        }                                                                              \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: ipc_cpp DIR\n");
        return 1;
    }
    try {
        // A bad configuration throws, with the status and the message.
        try {
            rocebus::ipc_config::from_toml("ring_bytes = 1000");
            EXPECT(false);
        } catch (const rocebus::error &e) {
            EXPECT(e.code() == rocebus::status::config);
            EXPECT(std::string(e.what()).find("ring_bytes") != std::string::npos);
        }
        auto cfg = rocebus::ipc_config::from_toml("[ipc]\ndir = \"" + std::string(argv[1]) +
                                                  "\"\nring_bytes = 65536\nmax_payload = 256\n");
        rocebus::ipc_publisher pub(cfg, "quotes");
        rocebus::ipc_subscriber sub(cfg, "quotes");
        sub.poll([](std::uint16_t, rocebus::span<const std::uint8_t>) {}, 16);  // joins
        EXPECT(sub.connected());

        const int n = 500;
        std::vector<std::uint64_t> got;
        got.reserve(n);
        for (int i = 0; i < n; i++) {
            std::uint64_t v = 1000u + static_cast<std::uint64_t>(i);
            if (i % 2) {
                auto c = pub.try_claim(7, sizeof v);
                EXPECT(c.ok());
                std::memcpy(c.data().data(), &v, sizeof v);
                EXPECT(c.commit() == rocebus::status::ok);
            } else {
                std::uint8_t b[sizeof v];
                std::memcpy(b, &v, sizeof v);
                EXPECT(pub.offer(7, b) == rocebus::status::ok);
            }
            if (i % 10 == 3) {
                auto dropped = pub.try_claim(8, 16);  // destroyed uncommitted: aborted
                EXPECT(dropped.ok());
                EXPECT(pub.offer(7, rocebus::span<const std::uint8_t>()) ==
                       rocebus::status::claim_open);
            }
            sub.poll(
                [&](std::uint16_t type, rocebus::span<const std::uint8_t> p) {
                    EXPECT(type == 7 && p.size() == sizeof(std::uint64_t));
                    std::uint64_t x;
                    std::memcpy(&x, p.data(), sizeof x);
                    got.push_back(x);
                },
                16);
        }
        EXPECT(got.size() == static_cast<std::size_t>(n));
        for (int i = 0; i < n; i++) EXPECT(got[i] == 1000u + static_cast<std::uint64_t>(i));

        // An exception from a handler stops the poll and comes out of poll(),
        // never through the C library.
        for (int i = 0; i < 3; i++) EXPECT(pub.offer(9, rocebus::span<const std::uint8_t>()) ==
                                           rocebus::status::ok);
        int calls = 0;
        try {
            sub.poll(
                [&](std::uint16_t, rocebus::span<const std::uint8_t>) {
                    calls++;
                    throw std::runtime_error("from the handler");
                },
                16);
            EXPECT(false);
        } catch (const std::runtime_error &e) {
            EXPECT(std::string(e.what()) == "from the handler");
        }
        EXPECT(calls == 1);
        // Polling the subscriber from its own handler is refused, not UB.
        rocebus::status inner = rocebus::status::ok;
        EXPECT(pub.offer(9, rocebus::span<const std::uint8_t>()) == rocebus::status::ok);
        sub.poll(
            [&](std::uint16_t, rocebus::span<const std::uint8_t>) {
                try {
                    sub.poll([](std::uint16_t, rocebus::span<const std::uint8_t>) {}, 1);
                } catch (const rocebus::error &e) {
                    inner = e.code();
                }
            },
            16);
        EXPECT(inner == rocebus::status::busy);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ipc_cpp: %s\n", e.what());
        return 2;
    }
    std::printf("ipc_cpp: ok\n");
    return 0;
}
