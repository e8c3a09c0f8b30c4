// orders_cpp: the C++17 wrapper (rocebus.hpp) on an orders connection over
// RDMA, both ends in one process: a listener thread echoes every frame back
// with its type plus one; the main thread sends with offer and with RAII
// claims, checks every byte that comes back, and that a claim destroyed
// uncommitted never arrives.
//
//   orders_cpp IP:PORT [ROUND_TRIPS]
//
// Exit status 0 and a last line "orders_cpp: N round trips ok" when every
// check held; run in the soft-RoCE guest by ffi/tests/c_examples.rs.
#include "rocebus.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define EXPECT(cond)                                                                   \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            std::fprintf(stderr, "orders_cpp: line %d: %s\n", __LINE__, #cond);        \
            std::exit(3);                                                              \
        }                                                                              \
    } while (0)

namespace {
constexpr std::uint16_t kAborted = 14, kStop = 99;

struct copied {
    std::uint16_t stream, type;
    std::vector<std::uint8_t> payload;
};

using clock_type = std::chrono::steady_clock;

// Sends (claim or offer), polling while back-pressured; then flushes.
void send(rocebus::orders_connection &c, std::uint16_t stream, std::uint16_t type,
          rocebus::span<const std::uint8_t> data, bool claim) {
    auto deadline = clock_type::now() + std::chrono::seconds(300);  // valgrind, emulated guest
    for (;;) {
        rocebus::status st;
        if (claim) {
            auto cl = c.try_claim(stream, type, data.size());
            st = cl.state();
            if (cl) {
                std::memcpy(cl.data().data(), data.data(), data.size());
                EXPECT(cl.commit() == rocebus::status::ok);
                break;
            }
        } else {
            st = c.offer(stream, type, data);
            if (st == rocebus::status::ok) break;
        }
        EXPECT(st == rocebus::status::back_pressured);
        EXPECT(clock_type::now() < deadline);
        c.poll([](const rocebus_frame_t &, rocebus::span<const std::uint8_t>) {}, 0);
    }
    EXPECT(c.flush() == rocebus::status::ok);
}
}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: orders_cpp IP:PORT [ROUND_TRIPS]\n");
        return 1;
    }
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 200;
    try {
        // A generous set-up timeout: the tests also run this under valgrind in an emulated
        // guest, where the handshake is some 50 times slower than natively.
        auto cfg = rocebus::orders_config::from_toml(
            "[orders]\ntoken = \"cpp-example\"\nring_size = 65536\nmax_payload = 512\n"
            "connect_timeout_ms = 60000\n");
        rocebus::orders_listener listener(cfg, argv[1]);
        int echoed = 0;
        std::thread server([&] {
          try {
            auto c = listener.accept(30000);
            std::vector<copied> in;
            in.reserve(8);
            for (bool stop = false; !stop;) {
                in.clear();
                c.poll(
                    [&](const rocebus_frame_t &f, rocebus::span<const std::uint8_t> p) {
                        in.push_back({f.stream_id, f.msg_type, {p.begin(), p.end()}});
                    },
                    8);
                for (auto &f : in) {
                    EXPECT(f.type != kAborted);
                    if (f.type == kStop) {
                        stop = true;
                        break;
                    }
                    send(c, f.stream, static_cast<std::uint16_t>(f.type + 1), f.payload,
                         echoed % 2 == 0);
                    echoed++;
                }
            }
          } catch (const std::exception &e) {
            std::fprintf(stderr, "orders_cpp server: %s\n", e.what());
            std::exit(2);
          }
        });
        auto c = rocebus::orders_connection::connect(cfg, argv[1]);
        std::array<std::uint8_t, 300> sent{};
        copied got;
        for (int i = 0; i < rounds; i++) {
            if (i % 10 == 5) {
                auto dropped = c.try_claim(1, kAborted, 16);  // destroyed: aborted
                EXPECT(dropped.ok());
                EXPECT(c.flush() == rocebus::status::claim_open);
            }
            std::size_t len = 8 + static_cast<std::size_t>(i) * 7 % 290;
            for (std::size_t k = 0; k < len; k++) sent[k] = static_cast<std::uint8_t>(i + k);
            auto stream = static_cast<std::uint16_t>(1 + i % 2);
            auto type = static_cast<std::uint16_t>(20 + 2 * (i % 3));
            send(c, stream, type, rocebus::span<const std::uint8_t>(sent.data(), len), i % 2);
            int n = 0;
            auto deadline = clock_type::now() + std::chrono::seconds(300);  // valgrind, emulated guest
            while (n == 0) {
                n = c.poll(
                    [&](const rocebus_frame_t &f, rocebus::span<const std::uint8_t> p) {
                        got = {f.stream_id, f.msg_type, {p.begin(), p.end()}};
                    },
                    1);
                EXPECT(clock_type::now() < deadline);
            }
            EXPECT(got.stream == stream && got.type == type + 1);
            EXPECT(got.payload.size() == len &&
                   std::memcmp(got.payload.data(), sent.data(), len) == 0);
        }
        send(c, 1, kStop, rocebus::span<const std::uint8_t>(), false);
        server.join();
        EXPECT(echoed == rounds);
        auto st = c.stats();
        EXPECT(st.frames_sent == static_cast<std::uint64_t>(rounds) + 1);
        EXPECT(st.frames_received == static_cast<std::uint64_t>(rounds));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "orders_cpp: %s\n", e.what());
        return 2;
    }
    std::printf("orders_cpp: %d round trips ok\n", rounds);
    return 0;
}
