// engine_cpp: a trading engine in C++17 on the real bus, through rocebus.hpp.
// It subscribes to the feed handler's market data (the normalized messages on
// the rocebus bus), logs on to the order gateway with an engine's config file,
// and for each fresh best bid and offer of a traded symbol sends a day limit
// order at the touch (buy at the bid, sell at the ask, alternately) until
// ORDERS were acknowledged and filled by the gateway's venue (the simulator
// fills every order at its limit price). The gateway takes its reference
// prices from the same bus: an order on a symbol whose first BBO reached us
// before it reached the gateway is rejected for want of a reference price
// (or as halted, when a resumption reached us first), which is counted and
// allowed; any other reject fails. It never trades a symbol it sees halted. Then it replaces and
// cancels the last order (too late: each is answered), and checks its
// positions against its fills.
//
//   engine_cpp ENGINE_TOML FEED_HANDLER_TOML LOCAL_IP PUBLISHER_IP [ORDERS]
//
// ENGINE_TOML is an engine's config (configs/demo/sample-engine.toml: its
// [gateway] and [rdma] tables), FEED_HANDLER_TOML the feed handler's (its
// [market_data] channels). Prints "engine_cpp: ready" once subscribed and
// logged on, and "engine_cpp: N orders acknowledged and filled" at the end
// (exit status 0) when every check held. Run in the soft-RoCE guest against
// the real feed-handler and order-gateway by ffi/tests/c_examples.rs.
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
            std::fprintf(stderr, "engine_cpp: line %d: %s\n", __LINE__, #cond);        \
            std::exit(3);                                                              \
        }                                                                              \
    } while (0)

namespace {

// The normalized market-data messages (md/src/normalized.rs): a 28-byte
// header (kind, version, stock locate, 8-byte space-padded symbol, exchange
// time, receive time), all integers little-endian; prices with 4 decimals.
constexpr std::uint8_t kKindBbo = 1, kKindStatus = 4, kVersion = 2;
constexpr std::size_t kBboLen = 60, kStatusLen = 36;

std::uint32_t le32(const std::uint8_t *p) {
    return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
           std::uint32_t(p[3]) << 24;
}

struct quote {
    std::string symbol;
    std::uint32_t bid = 0, ask = 0;
    bool fresh = false;   // a BBO arrived since the last order on it
    bool halted = false;  // trading status halted, paused or quotation only
};

struct order {
    std::uint64_t id;
    std::size_t quote;
    rocebus_side side;
    std::uint32_t qty;
    std::int64_t price;
    bool acked = false, filled = false, rejected = false;
};

using clock_type = std::chrono::steady_clock;
}  // namespace

int main(int argc, char **argv) {
    if (argc < 5) {
        std::fprintf(stderr,
                     "usage: engine_cpp ENGINE_TOML FEED_HANDLER_TOML LOCAL_IP PUBLISHER_IP "
                     "[ORDERS [SECONDS]]\n");
        return 1;
    }
    const int target = argc > 5 ? std::atoi(argv[5]) : 20;
    // How long to trade before giving up (longer under valgrind).
    const int seconds = argc > 6 ? std::atoi(argv[6]) : 120;
    std::vector<quote> quotes;
    for (const char *s : {"A", "B", "C", "D", "E", "F", "G", "H"}) quotes.push_back({s});
    try {
        // The five lines of the README: market data in, orders out.
        auto md_cfg = rocebus::md_config::from_file(argv[2]);
        std::vector<rocebus::md_subscriber> md;
        for (std::uint16_t ch : {1, 2})
            md.push_back(rocebus::md_subscriber::connect(md_cfg, ch, argv[3], argv[4]));
        auto gw = rocebus::engine_session::connect(rocebus::engine_config::from_file(argv[1]));
        std::printf("engine_cpp: ready\n");
        std::fflush(stdout);

        std::vector<order> orders;
        orders.reserve(static_cast<std::size_t>(target));
        std::uint64_t md_messages = 0, bbos = 0, events = 0, acks = 0, fills = 0, rejects = 0;
        std::uint64_t no_reference = 0;
        std::uint64_t late_answers = 0, bad = 0;
        auto on_md = [&](std::uint64_t, rocebus::span<const std::uint8_t> m) {
            md_messages++;
            bool bbo = m.size() == kBboLen && m[0] == kKindBbo;
            bool status = m.size() == kStatusLen && m[0] == kKindStatus;
            if (!(bbo || status) || m[1] != kVersion) return;
            char sym[9] = {};
            std::memcpy(sym, m.data() + 4, 8);
            for (int i = 7; i >= 0 && sym[i] == ' '; i--) sym[i] = 0;
            for (auto &q : quotes) {
                if (q.symbol != sym) continue;
                if (status) {
                    q.halted = m[28] == 'H' || m[28] == 'P' || m[28] == 'Q';
                    continue;
                }
                q.bid = le32(m.data() + 28);
                q.ask = le32(m.data() + 32);
                q.fresh = true;
                bbos++;
            }
        };
        auto on_event = [&](const rocebus_md_event_t &e) {
            events++;
            if (e.kind == ROCEBUS_MD_EVENT_KIND_UNRECOVERABLE_LOSS ||
                e.kind == ROCEBUS_MD_EVENT_KIND_SNAPSHOT_APPLIED)
                for (auto &q : quotes) q = {q.symbol, 0, 0, false, q.halted};  // stale quotes
        };
        std::uint64_t late_id = 0;
        int late_sent = 0;
        auto on_response = [&](const rocebus_engine_response_t &r) {
            // The answers to the late replace and cancel: a reject naming the request,
            // or (had the venue taken them) a replaced or canceled the book refuses as
            // coming for an order already final.
            if (late_id != 0 && r.cl_ord_id == late_id &&
                ((r.kind == ROCEBUS_RESPONSE_KIND_REJECT && r.request != 'N') ||
                 r.error == ROCEBUS_RESPONSE_ERROR_ALREADY_FINAL)) {
                late_answers++;
                return;
            }
            if (r.error != ROCEBUS_RESPONSE_ERROR_NONE) {
                bad++;
                return;
            }
            order *o = nullptr;
            for (auto &x : orders)
                if (x.id == r.cl_ord_id) o = &x;
            EXPECT(o != nullptr);
            switch (r.kind) {
                case ROCEBUS_RESPONSE_KIND_ACK:
                    acks++;
                    o->acked = true;
                    break;
                case ROCEBUS_RESPONSE_KIND_FILL:
                    fills++;
                    EXPECT(r.qty == o->qty && r.cum_qty == o->qty && r.leaves_qty == 0);
                    EXPECT(r.price == o->price);
                    o->filled = true;
                    break;
                case ROCEBUS_RESPONSE_KIND_REJECT:
                    o->rejected = true;
                    // 6, 7, 14: no reference price yet, a stale one, halted (the
                    // gateway's view of the bus lags ours: we never send on a symbol we
                    // see halted); anything else is a failure.
                    if (r.reason == 6 || r.reason == 7 || r.reason == 14) {
                        no_reference++;
                        break;
                    }
                    rejects++;
                    std::fprintf(stderr, "engine_cpp: order %llu rejected, reason %u\n",
                                 static_cast<unsigned long long>(r.cl_ord_id), r.reason);
                    break;
                default:
                    bad++;
            }
        };

        auto deadline = clock_type::now() + std::chrono::seconds(seconds);
        // Orders not rejected for want of a reference price: the ones that count.
        auto live = [&] {
            int n = 0;
            for (auto &o : orders) n += !o.rejected;
            return n;
        };
        auto last_live = [&]() -> order * {
            for (auto it = orders.rbegin(); it != orders.rend(); ++it)
                if (!it->rejected) return &*it;
            return nullptr;
        };
        auto done = [&] {
            if (live() < target || late_answers < 2) return false;
            for (auto &o : orders)
                if (!o.rejected && (!o.acked || !o.filled)) return false;
            return true;
        };
        unsigned idle = 0;
        while (!done()) {
            if (clock_type::now() > deadline) {
                std::fprintf(stderr,
                             "engine_cpp: timed out: %zu orders sent, %llu acks, %llu fills, "
                             "%llu rejects (%llu for the reference price), %llu late answers, "
                             "%llu md messages, %llu BBOs\n",
                             orders.size(), static_cast<unsigned long long>(acks),
                             static_cast<unsigned long long>(fills),
                             static_cast<unsigned long long>(rejects),
                             static_cast<unsigned long long>(no_reference),
                             static_cast<unsigned long long>(late_answers),
                             static_cast<unsigned long long>(md_messages),
                             static_cast<unsigned long long>(bbos));
                return 4;
            }
            int work = 0;
            for (auto &s : md) work += s.poll(on_md, on_event, 64);
            work += gw.poll(on_response, 64);
            // Several busy processes share the guest's emulated cores: back off when
            // idle instead of spinning (as configs/demo's idle = "backoff" does).
            if (work > 0) {
                idle = 0;
            } else if (++idle > 1000) {
                std::this_thread::sleep_for(std::chrono::microseconds(50));
            }
            if (rejects > 0) return 5;  // a reject for another reason: stop here
            bool sent = false;
            for (std::size_t i = 0; i < quotes.size(); i++) {
                auto &q = quotes[i];
                if (live() >= target) break;
                if (!q.fresh || q.halted || q.bid == 0 || q.ask == 0) continue;
                q.fresh = false;
                auto side = orders.size() % 2 ? ROCEBUS_SIDE_SELL : ROCEBUS_SIDE_BUY;
                std::int64_t price = side == ROCEBUS_SIDE_BUY ? q.bid : q.ask;
                std::uint64_t id = 0;
                auto st = gw.new_order(q.symbol.c_str(), side, 100, price, id);
                if (st == rocebus::status::back_pressured) break;
                EXPECT(st == rocebus::status::ok);
                orders.push_back({id, i, side, 100, price});
                sent = true;
            }
            if (live() >= target && late_sent == 0 && last_live()->filled) {
                // The last order is filled: a replace and a cancel come too late, and
                // each is answered (a reject naming the request, or so the venue says).
                late_id = last_live()->id;
                EXPECT(gw.replace(late_id, 200, last_live()->price) == rocebus::status::ok);
                EXPECT(gw.cancel(late_id) == rocebus::status::ok);
                late_sent = 2;
                sent = true;
            }
            if (sent) EXPECT(gw.flush() == rocebus::status::ok);
        }
        EXPECT(rejects == 0 && bad == 0);
        // Positions from the fills, as the session's book has them.
        for (std::size_t i = 0; i < quotes.size(); i++) {
            std::int64_t want = 0;
            for (auto &o : orders)
                if (o.quote == i && o.filled)
                    want += o.side == ROCEBUS_SIDE_BUY ? o.qty : -std::int64_t(o.qty);
            EXPECT(gw.position(quotes[i].symbol.c_str()) == want);
        }
        rocebus_engine_order_t o{};
        const order &first = *last_live();
        EXPECT(gw.order(first.id, o) && o.state == ROCEBUS_ORDER_STATE_FILLED);
        EXPECT(o.cum_qty == 100 && std::string(o.symbol) == quotes[first.quote].symbol);
        for (auto &x : orders)
            if (x.rejected)
                EXPECT(gw.order(x.id, o) && o.state == ROCEBUS_ORDER_STATE_REJECTED &&
                       (o.reject_reason == 6 || o.reject_reason == 7 || o.reject_reason == 14));
        EXPECT(!gw.order(orders.back().id + 1000, o));
        auto st = gw.stats();
        EXPECT(st.connection.frames_sent >= orders.size() + 2);
        EXPECT(fills == static_cast<std::uint64_t>(target) && acks == fills);
        EXPECT(st.next_order_id == orders.back().id + 1 && st.caught_up == 1);
        std::uint64_t delivered = 0;
        for (auto &s : md) delivered += s.counters().delivered;
        EXPECT(delivered == md_messages);
        std::printf(
            "engine_cpp: %d orders acknowledged and filled (%llu rejected for the gateway's "
            "lagging view of the bus; %llu market-data messages, %llu BBOs, %llu events, %llu answers "
            "to the late replace and cancel)\n",
            target, static_cast<unsigned long long>(no_reference),
            static_cast<unsigned long long>(md_messages),
            static_cast<unsigned long long>(bbos), static_cast<unsigned long long>(events),
            static_cast<unsigned long long>(late_answers));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "engine_cpp: %s\n", e.what());
        return 2;
    }
    return 0;
}
