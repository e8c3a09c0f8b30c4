// rocebus.hpp: a header-only C++17 wrapper of rocebus.h.
//
// - RAII: every handle closes itself; handles move, never copy.
// - Set-up failures (a bad configuration, no device, a refused handshake)
//   throw rocebus::error (code() and what()). The per-message calls never
//   throw and never allocate: they return a rocebus::status (ok,
//   back_pressured, ...), the way a polling loop wants it.
// - Handlers are any callables (lambdas); payloads are rocebus::span (std::span
//   under C++20) valid ONLY during the call. An exception thrown by a handler
//   is caught before it can reach the C library and rethrown from poll()
//   once the library has returned; the messages after it in that same poll
//   are skipped (consumed, not delivered): poll with a limit of 1 where a
//   handler may throw and no message may be missed.
// - A claim is an RAII object: commit() publishes it, its destructor aborts it.
//
// Checked by ffi/tests/c_examples.rs (examples/ipc_cpp.cpp under valgrind;
// orders_cpp.cpp and engine_cpp.cpp, the engine on the real bus, in the guest).
#ifndef ROCEBUS_HPP
#define ROCEBUS_HPP

#include "rocebus.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#if defined(__has_include)
#if __has_include(<version>)
#include <version>
#endif
#endif
#if defined(__cpp_lib_span)
#include <span>
#endif

namespace rocebus {

#if defined(__cpp_lib_span)
template <class T>
using span = std::span<T>;
#else
/// A pointer and a length (std::span's shape, for C++17).
template <class T>
class span {
  public:
    constexpr span() noexcept = default;
    constexpr span(T *data, std::size_t size) noexcept : data_(data), size_(size) {}
    template <std::size_t N>
    constexpr span(T (&a)[N]) noexcept : data_(a), size_(N) {}
    template <class C, class = decltype(std::declval<C &>().data())>
    constexpr span(C &c) noexcept : data_(c.data()), size_(c.size()) {}
    constexpr T *data() const noexcept { return data_; }
    constexpr std::size_t size() const noexcept { return size_; }
    constexpr bool empty() const noexcept { return size_ == 0; }
    constexpr T *begin() const noexcept { return data_; }
    constexpr T *end() const noexcept { return data_ + size_; }
    constexpr T &operator[](std::size_t i) const noexcept { return data_[i]; }

  private:
    T *data_ = nullptr;
    std::size_t size_ = 0;
};
#endif

/// What a call returned (rocebus_status_t).
enum class status : int {
    ok = ROCEBUS_STATUS_OK,
    null_argument = ROCEBUS_STATUS_NULL_ARGUMENT,
    invalid_argument = ROCEBUS_STATUS_INVALID_ARGUMENT,
    config = ROCEBUS_STATUS_CONFIG,
    io = ROCEBUS_STATUS_IO,
    back_pressured = ROCEBUS_STATUS_BACK_PRESSURED,
    too_large = ROCEBUS_STATUS_TOO_LARGE,
    reserved_type = ROCEBUS_STATUS_RESERVED_TYPE,
    peer_lost = ROCEBUS_STATUS_PEER_LOST,
    claim_open = ROCEBUS_STATUS_CLAIM_OPEN,
    no_claim = ROCEBUS_STATUS_NO_CLAIM,
    busy = ROCEBUS_STATUS_BUSY,
    poisoned = ROCEBUS_STATUS_POISONED,
    timeout = ROCEBUS_STATUS_TIMEOUT,
    refused = ROCEBUS_STATUS_REFUSED,
    panic = ROCEBUS_STATUS_PANIC,
    corrupt = ROCEBUS_STATUS_CORRUPT,
};

/// The status of a C return value (a count >= 0 is ok).
inline status to_status(int rc) noexcept { return rc >= 0 ? status::ok : static_cast<status>(rc); }

/// A failed call: its status and rocebus_last_error()'s message.
class error : public std::runtime_error {
  public:
    explicit error(int rc)
        : std::runtime_error(std::string(rocebus_status_name(rc)) + ": " + rocebus_last_error()),
          code_(static_cast<status>(rc)) {}
    status code() const noexcept { return code_; }

  private:
    status code_;
};

/// Throws rocebus::error when rc is negative; returns rc otherwise.
inline int check(int rc) {
    if (rc < 0) throw error(rc);
    return rc;
}

/// rocebus_now_ns(): read once per turn of a polling loop.
inline std::uint64_t now_ns() noexcept { return rocebus_now_ns(); }

namespace detail {
/// Owns a C handle; `Free` is its rocebus_*_free.
template <class T, auto Free>
class owned {
  public:
    owned() noexcept = default;
    explicit owned(T *p) noexcept : p_(p) {}
    owned(owned &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
    owned &operator=(owned &&o) noexcept {
        if (this != &o) {
            reset();
            p_ = std::exchange(o.p_, nullptr);
        }
        return *this;
    }
    owned(const owned &) = delete;
    owned &operator=(const owned &) = delete;
    ~owned() { reset(); }
    T *get() const noexcept { return p_; }

  private:
    void reset() noexcept {
        if (p_) (void)Free(std::exchange(p_, nullptr));
    }
    T *p_ = nullptr;
};

/// Calls a handler, keeping an exception for after the C call returns.
template <class F>
struct call {
    F &f;
    std::exception_ptr err;
};
}  // namespace detail

/// An ipc stream's configuration (TOML text or file, as `[ipc]`).
class ipc_config {
  public:
    static ipc_config from_toml(const std::string &toml) {
        rocebus_ipc_config_t *c = nullptr;
        check(rocebus_ipc_config_from_toml(toml.c_str(), &c));
        return ipc_config(c);
    }
    static ipc_config from_file(const std::string &path) {
        rocebus_ipc_config_t *c = nullptr;
        check(rocebus_ipc_config_from_file(path.c_str(), &c));
        return ipc_config(c);
    }
    const rocebus_ipc_config_t *get() const noexcept { return h_.get(); }

  private:
    explicit ipc_config(rocebus_ipc_config_t *c) : h_(c) {}
    static int free_(rocebus_ipc_config_t *c) noexcept {
        rocebus_ipc_config_free(c);
        return 0;
    }
    detail::owned<rocebus_ipc_config_t, free_> h_;
};

/// A claimed frame: fill data(), then commit(); destroyed uncommitted, it
/// is aborted. `ok()` is false (and status() says why) when the claim
/// was refused.
template <class Handle, int (*Commit)(Handle *), int (*Abort)(Handle *)>
class basic_claim {
  public:
    basic_claim(Handle *h, int rc, std::uint8_t *buf, std::size_t len) noexcept
        : h_(rc == 0 ? h : nullptr), rc_(rc), data_(buf, rc == 0 ? len : 0) {}
    basic_claim(basic_claim &&o) noexcept
        : h_(std::exchange(o.h_, nullptr)), rc_(o.rc_), data_(o.data_) {}
    basic_claim(const basic_claim &) = delete;
    basic_claim &operator=(const basic_claim &) = delete;
    basic_claim &operator=(basic_claim &&) = delete;
    ~basic_claim() {
        if (h_) (void)Abort(h_);
    }
    bool ok() const noexcept { return h_ != nullptr; }
    explicit operator bool() const noexcept { return ok(); }
    status state() const noexcept { return to_status(rc_); }
    span<std::uint8_t> data() const noexcept { return data_; }
    status commit() noexcept {
        if (!h_) return status::no_claim;
        return to_status(Commit(std::exchange(h_, nullptr)));
    }
    status abort() noexcept {
        if (!h_) return status::no_claim;
        return to_status(Abort(std::exchange(h_, nullptr)));
    }

  private:
    Handle *h_;
    int rc_;
    span<std::uint8_t> data_;
};

/// Publishes on an ipc stream (closes it when destroyed).
class ipc_publisher {
  public:
    using claim = basic_claim<rocebus_ipc_publisher_t, rocebus_ipc_publisher_commit,
                              rocebus_ipc_publisher_abort>;
    ipc_publisher(const ipc_config &cfg, const std::string &name) {
        rocebus_ipc_publisher_t *p = nullptr;
        check(rocebus_ipc_publisher_new(cfg.get(), name.c_str(), &p));
        h_ = decltype(h_)(p);
    }
    /// Copies and publishes; status::back_pressured: try again.
    status offer(std::uint16_t msg_type, span<const std::uint8_t> payload) noexcept {
        return to_status(
            rocebus_ipc_publisher_offer(h_.get(), msg_type, payload.data(), payload.size()));
    }
    /// A frame of `len` bytes in the ring itself.
    claim try_claim(std::uint16_t msg_type, std::size_t len) noexcept {
        std::uint8_t *buf = nullptr;
        int rc = rocebus_ipc_publisher_try_claim(h_.get(), msg_type, len, &buf);
        return claim(h_.get(), rc, buf, len);
    }
    /// Housekeeping (dead subscribers), once in a while; returns how many
    /// events wait.
    int poll(std::uint64_t now = now_ns()) noexcept {
        return rocebus_ipc_publisher_poll(h_.get(), now);
    }
    /// The next event (a subscriber gone or dropped), if one waits.
    bool poll_event(rocebus_ipc_pub_event_t &out) {
        return check(rocebus_ipc_publisher_poll_event(h_.get(), &out)) == 1;
    }
    rocebus_ipc_publisher_t *get() const noexcept { return h_.get(); }

  private:
    detail::owned<rocebus_ipc_publisher_t, rocebus_ipc_publisher_free> h_;
};

/// Subscribes to an ipc stream (joins its publisher in a later poll).
class ipc_subscriber {
  public:
    ipc_subscriber(const ipc_config &cfg, const std::string &name) {
        rocebus_ipc_subscriber_t *s = nullptr;
        check(rocebus_ipc_subscriber_new(cfg.get(), name.c_str(), &s));
        h_ = decltype(h_)(s);
    }
    /// Calls `f(std::uint16_t msg_type, rocebus::span<const std::uint8_t>
    /// payload)` for up to `limit` messages; returns how many. An
    /// exception from `f` stops the poll and is rethrown here.
    template <class F>
    int poll(F &&f, std::size_t limit, std::uint64_t now = now_ns()) {
        detail::call<F> c{f, nullptr};
        int n = rocebus_ipc_subscriber_poll(h_.get(), now, &trampoline<F>, &c, limit);
        if (c.err) std::rethrow_exception(c.err);
        return check(n);
    }
    /// The next lifecycle event, if one waits.
    bool poll_event(rocebus_ipc_event_t &out) {
        return check(rocebus_ipc_subscriber_poll_event(h_.get(), &out)) == 1;
    }
    bool connected() const { return check(rocebus_ipc_subscriber_is_connected(h_.get())) == 1; }
    rocebus_ipc_subscriber_t *get() const noexcept { return h_.get(); }

  private:
    template <class F>
    static void trampoline(void *clientd, std::uint16_t msg_type, const std::uint8_t *payload,
                           std::size_t len) noexcept {
        auto *c = static_cast<detail::call<F> *>(clientd);
        if (c->err) return;  // a handler threw: skip the rest of this poll's messages
        try {
            c->f(msg_type, span<const std::uint8_t>(payload, len));
        } catch (...) {
            c->err = std::current_exception();
        }
    }
    detail::owned<rocebus_ipc_subscriber_t, rocebus_ipc_subscriber_free> h_;
};

/// An orders connection's configuration (TOML text or file, as `[orders]`).
class orders_config {
  public:
    static orders_config from_toml(const std::string &toml) {
        rocebus_orders_config_t *c = nullptr;
        check(rocebus_orders_config_from_toml(toml.c_str(), &c));
        return orders_config(c);
    }
    static orders_config from_file(const std::string &path) {
        rocebus_orders_config_t *c = nullptr;
        check(rocebus_orders_config_from_file(path.c_str(), &c));
        return orders_config(c);
    }
    const rocebus_orders_config_t *get() const noexcept { return h_.get(); }

  private:
    explicit orders_config(rocebus_orders_config_t *c) : h_(c) {}
    static int free_(rocebus_orders_config_t *c) noexcept {
        rocebus_orders_config_free(c);
        return 0;
    }
    detail::owned<rocebus_orders_config_t, free_> h_;
};

/// An orders connection (either end; disconnects when destroyed).
class orders_connection {
  public:
    using claim = basic_claim<rocebus_orders_connection_t, rocebus_orders_connection_commit,
                              rocebus_orders_connection_abort>;
    /// Connects to the listener at "IP:PORT" (blocks, bounded by connect_timeout_ms).
    static orders_connection connect(const orders_config &cfg, const std::string &addr) {
        rocebus_orders_connection_t *c = nullptr;
        check(rocebus_orders_connect(cfg.get(), addr.c_str(), &c));
        return orders_connection(c);
    }
    explicit orders_connection(rocebus_orders_connection_t *c) noexcept : h_(c) {}
    status offer(std::uint16_t stream, std::uint16_t msg_type,
                 span<const std::uint8_t> payload) noexcept {
        return to_status(rocebus_orders_connection_offer(h_.get(), stream, msg_type,
                                                         payload.data(), payload.size()));
    }
    claim try_claim(std::uint16_t stream, std::uint16_t msg_type, std::size_t len) noexcept {
        std::uint8_t *buf = nullptr;
        int rc = rocebus_orders_connection_try_claim(h_.get(), stream, msg_type, len, &buf);
        return claim(h_.get(), rc, buf, len);
    }
    status flush() noexcept { return to_status(rocebus_orders_connection_flush(h_.get())); }
    /// Calls `f(const rocebus_frame_t &frame, rocebus::span<const std::uint8_t>
    /// payload)` for up to `limit` frames; returns how many, or throws
    /// rocebus::error (peer lost, corrupt). An exception from `f` stops
    /// the poll and is rethrown here.
    template <class F>
    int poll(F &&f, std::size_t limit) {
        detail::call<F> c{f, nullptr};
        int n = rocebus_orders_connection_poll(h_.get(), &trampoline<F>, &c, limit);
        if (c.err) std::rethrow_exception(c.err);
        return check(n);
    }
    rocebus_orders_stats_t stats() const {
        rocebus_orders_stats_t s{};
        check(rocebus_orders_connection_stats(h_.get(), &s));
        return s;
    }
    rocebus_orders_connection_t *get() const noexcept { return h_.get(); }

  private:
    template <class F>
    static void trampoline(void *clientd, const rocebus_frame_t *frame) noexcept {
        auto *c = static_cast<detail::call<F> *>(clientd);
        if (c->err) return;
        try {
            c->f(*frame, span<const std::uint8_t>(frame->payload, frame->len));
        } catch (...) {
            c->err = std::current_exception();
        }
    }
    detail::owned<rocebus_orders_connection_t, rocebus_orders_connection_free> h_;
};

/// Listens for orders connections (the gateway's side).
class orders_listener {
  public:
    orders_listener(const orders_config &cfg, const std::string &addr) {
        rocebus_orders_listener_t *l = nullptr;
        check(rocebus_orders_listener_bind(cfg.get(), addr.c_str(), &l));
        h_ = decltype(h_)(l);
    }
    int local_port() const { return check(rocebus_orders_listener_local_port(h_.get())); }
    /// Waits up to timeout_ms for a peer; throws rocebus::error
    /// (status::timeout when none came).
    orders_connection accept(std::uint64_t timeout_ms) {
        rocebus_orders_connection_t *c = nullptr;
        check(rocebus_orders_listener_accept(h_.get(), timeout_ms, &c));
        return orders_connection(c);
    }

  private:
    detail::owned<rocebus_orders_listener_t, rocebus_orders_listener_free> h_;
};

/// An engine's configuration for the order gateway: its config file's
/// `[gateway]` and `[rdma]` tables (configs/demo/sample-engine.toml).
class engine_config {
  public:
    static engine_config from_toml(const std::string &toml) {
        rocebus_engine_config_t *c = nullptr;
        check(rocebus_engine_config_from_toml(toml.c_str(), &c));
        return engine_config(c);
    }
    static engine_config from_file(const std::string &path) {
        rocebus_engine_config_t *c = nullptr;
        check(rocebus_engine_config_from_file(path.c_str(), &c));
        return engine_config(c);
    }
    const rocebus_engine_config_t *get() const noexcept { return h_.get(); }

  private:
    explicit engine_config(rocebus_engine_config_t *c) : h_(c) {}
    static int free_(rocebus_engine_config_t *c) noexcept {
        rocebus_engine_config_free(c);
        return 0;
    }
    detail::owned<rocebus_engine_config_t, free_> h_;
};

/// A logged-on session with the order gateway (disconnects when destroyed:
/// the gateway then cancels the engine's open orders).
class engine_session {
  public:
    /// Connects and logs on (blocks, retrying for connect_timeout_ms while the
    /// gateway starts); throws rocebus::error.
    static engine_session connect(const engine_config &cfg, std::uint64_t first_order_id = 1,
                                  std::size_t expected_orders = 0) {
        rocebus_engine_session_t *s = nullptr;
        check(rocebus_engine_connect(cfg.get(), first_order_id, expected_orders, &s));
        return engine_session(s);
    }
    /// Queues a day limit order (price with 4 implied decimals; account 0:
    /// the configuration's); `id` is its order id. status::back_pressured:
    /// nothing was sent, poll and try again.
    status new_order(const char *symbol, rocebus_side side, std::uint32_t qty, std::int64_t price,
                     std::uint64_t &id, std::uint32_t account = 0) noexcept {
        return to_status(rocebus_engine_session_new_order(h_.get(), account, symbol, side, qty,
                                                          price, &id));
    }
    status cancel(std::uint64_t id) noexcept {
        return to_status(rocebus_engine_session_cancel(h_.get(), id));
    }
    status replace(std::uint64_t id, std::uint32_t qty, std::int64_t price) noexcept {
        return to_status(rocebus_engine_session_replace(h_.get(), id, qty, price));
    }
    /// Account 0: every account; symbol nullptr: every symbol.
    status mass_cancel(std::uint32_t account = 0, const char *symbol = nullptr) noexcept {
        return to_status(rocebus_engine_session_mass_cancel(h_.get(), account, symbol));
    }
    status flush() noexcept { return to_status(rocebus_engine_session_flush(h_.get())); }
    /// Calls `f(const rocebus_engine_response_t &)` for up to `limit`
    /// responses (valid only during the call); returns how many frames were
    /// read, or throws rocebus::error (the gateway is gone). An exception from
    /// `f` stops the poll and is rethrown here.
    template <class F>
    int poll(F &&f, std::size_t limit) {
        detail::call<F> c{f, nullptr};
        int n = rocebus_engine_session_poll(h_.get(), &trampoline<F>, &c, limit);
        if (c.err) std::rethrow_exception(c.err);
        return check(n);
    }
    /// Order `id` of the engine's book, if the session sent it.
    bool order(std::uint64_t id, rocebus_engine_order_t &out) const {
        return check(rocebus_engine_session_order(h_.get(), id, &out)) == 1;
    }
    /// Net position in `symbol` from the fills received.
    std::int64_t position(const char *symbol) const {
        std::int64_t p = 0;
        check(rocebus_engine_session_position(h_.get(), symbol, &p));
        return p;
    }
    rocebus_engine_stats_t stats() const {
        rocebus_engine_stats_t s{};
        check(rocebus_engine_session_stats(h_.get(), &s));
        return s;
    }
    rocebus_engine_session_t *get() const noexcept { return h_.get(); }

  private:
    explicit engine_session(rocebus_engine_session_t *s) noexcept : h_(s) {}
    template <class F>
    static void trampoline(void *clientd, const rocebus_engine_response_t *r) noexcept {
        auto *c = static_cast<detail::call<F> *>(clientd);
        if (c->err) return;
        try {
            c->f(*r);
        } catch (...) {
            c->err = std::current_exception();
        }
    }
    detail::owned<rocebus_engine_session_t, rocebus_engine_session_free> h_;
};

/// A market-data path's configuration: the feed handler's config file (its
/// `[market_data]` table) or a market-data file.
class md_config {
  public:
    static md_config from_toml(const std::string &toml) {
        rocebus_md_config_t *c = nullptr;
        check(rocebus_md_config_from_toml(toml.c_str(), &c));
        return md_config(c);
    }
    static md_config from_file(const std::string &path) {
        rocebus_md_config_t *c = nullptr;
        check(rocebus_md_config_from_file(path.c_str(), &c));
        return md_config(c);
    }
    const rocebus_md_config_t *get() const noexcept { return h_.get(); }

  private:
    explicit md_config(rocebus_md_config_t *c) : h_(c) {}
    static int free_(rocebus_md_config_t *c) noexcept {
        rocebus_md_config_free(c);
        return 0;
    }
    detail::owned<rocebus_md_config_t, free_> h_;
};

/// Subscribes to one market-data channel of the bus (either transport).
/// Snapshots are skipped (a late join or resync is a gap, reported as
/// events); restore them through the C API's on_snapshot_* callbacks.
class md_subscriber {
  public:
    /// Subscribes without waiting for the publisher (a later poll connects).
    md_subscriber(const md_config &cfg, std::uint16_t channel, const std::string &local,
                  const std::string &publisher) {
        rocebus_md_subscriber_t *s = nullptr;
        check(rocebus_md_subscriber_new(cfg.get(), channel, local.c_str(), publisher.c_str(),
                                        &s));
        h_ = decltype(h_)(s);
    }
    /// Subscribes and waits for the publisher (up to connect_timeout_ms).
    static md_subscriber connect(const md_config &cfg, std::uint16_t channel,
                                 const std::string &local, const std::string &publisher) {
        rocebus_md_subscriber_t *s = nullptr;
        check(rocebus_md_subscriber_connect(cfg.get(), channel, local.c_str(),
                                            publisher.c_str(), &s));
        return md_subscriber(s);
    }
    /// Calls `on_message(std::uint64_t seq, rocebus::span<const std::uint8_t>
    /// msg)` for each message in order and `on_event(const rocebus_md_event_t
    /// &)` for each lifecycle event after them, taking at most `limit`
    /// datagrams per line; returns the work done or throws rocebus::error. An
    /// exception from a handler stops the delivery and is rethrown here.
    template <class M, class E>
    int poll(M &&on_message, E &&on_event, std::size_t limit, std::uint64_t now = now_ns()) {
        calls<M, E> c{on_message, on_event, nullptr};
        rocebus_md_handler_t h{};
        h.clientd = &c;
        h.on_message = &message<M, E>;
        h.on_event = &event<M, E>;
        int n = rocebus_md_subscriber_poll(h_.get(), now, &h, limit);
        if (c.err) std::rethrow_exception(c.err);
        return check(n);
    }
    /// As above; events wait for poll_event().
    template <class M>
    int poll(M &&on_message, std::size_t limit, std::uint64_t now = now_ns()) {
        auto none = [](const rocebus_md_event_t &) {};
        calls<M, decltype(none)> c{on_message, none, nullptr};
        rocebus_md_handler_t h{};
        h.clientd = &c;
        h.on_message = &message<M, decltype(none)>;
        int n = rocebus_md_subscriber_poll(h_.get(), now, &h, limit);
        if (c.err) std::rethrow_exception(c.err);
        return check(n);
    }
    bool poll_event(rocebus_md_event_t &out) {
        return check(rocebus_md_subscriber_poll_event(h_.get(), &out)) == 1;
    }
    bool connected() const { return check(rocebus_md_subscriber_is_connected(h_.get())) == 1; }
    rocebus_md_counters_t counters() const {
        rocebus_md_counters_t c{};
        check(rocebus_md_subscriber_counters(h_.get(), &c));
        return c;
    }
    rocebus_md_subscriber_t *get() const noexcept { return h_.get(); }

  private:
    explicit md_subscriber(rocebus_md_subscriber_t *s) noexcept : h_(s) {}
    template <class M, class E>
    struct calls {
        M &m;
        E &e;
        std::exception_ptr err;
    };
    template <class M, class E>
    static void message(void *clientd, std::uint64_t seq, const std::uint8_t *msg,
                        std::size_t len) noexcept {
        auto *c = static_cast<calls<M, E> *>(clientd);
        if (c->err) return;
        try {
            c->m(seq, span<const std::uint8_t>(msg, len));
        } catch (...) {
            c->err = std::current_exception();
        }
    }
    template <class M, class E>
    static void event(void *clientd, const rocebus_md_event_t *e) noexcept {
        auto *c = static_cast<calls<M, E> *>(clientd);
        if (c->err) return;
        try {
            c->e(*e);
        } catch (...) {
            c->err = std::current_exception();
        }
    }
    detail::owned<rocebus_md_subscriber_t, rocebus_md_subscriber_free> h_;
};

}  // namespace rocebus

#endif  // ROCEBUS_HPP
