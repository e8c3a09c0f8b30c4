//! The metrics endpoint of `rocebus stat --listen`: the Prometheus text exposition of every
//! component's counters, served over plain HTTP/1.1 on `GET /metrics`.
//!
//! What to answer is decided by [`respond`], a pure function of the request head; the
//! [`MetricsServer`] around it only moves bytes: it accepts connections, gives each one a
//! thread (at most [`Limits::max_connections`] at a time, and at most
//! [`Limits::max_per_address`] from one IP address), reads at most
//! [`Limits::max_request_bytes`] of request head within [`Limits::read_timeout`] (1 s: a
//! scraper sends its head at once), writes one answer and closes. A slow or malicious
//! client can hold one thread for one short timeout, never the accept loop or another
//! scrape, and one address holding slow connections cannot take the slots a scraper from
//! another address needs (it is answered 503 beyond its share). No keep-alive, no request bodies, no TLS: the
//! endpoint is meant for a scraper on a trusted network (bind it to loopback or the
//! management interface).
//!
//! This module reads no counters itself: the caller's closure renders the page for each
//! scrape (so components that start or exit in between appear or disappear).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `Content-Type` of the Prometheus text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The one path served.
pub const METRICS_PATH: &str = "/metrics";

/// How much a client may ask of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest request head (request line and headers) read, in bytes; a longer one is
    /// answered 431.
    pub max_request_bytes: usize,
    /// Time a client has to send its whole request head; then it is answered 408.
    pub read_timeout: Duration,
    /// Time the answer may take to write before the connection is dropped.
    pub write_timeout: Duration,
    /// Connections served at once; more are answered 503 at once.
    pub max_connections: usize,
    /// Connections served at once from one IP address; more from it are answered 503 at
    /// once, so one address cannot take every slot.
    pub max_per_address: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_request_bytes: 8192,
            read_timeout: Duration::from_secs(1),
            write_timeout: Duration::from_secs(5),
            max_connections: 16,
            max_per_address: 4,
        }
    }
}

/// One HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type` of the body.
    pub content_type: &'static str,
    /// Extra header lines (each without the line end), e.g. `Allow: GET`.
    pub headers: Vec<String>,
    /// The body.
    pub body: String,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// The answer as bytes on the wire (`Connection: close`: one request per connection).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        for h in &self.headers {
            out.push_str(h);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        out.push_str(&self.body);
        out.into_bytes()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Length of the request head in `buf` (up to and including the blank line that ends it),
/// or `None` while it is incomplete. Bare `\n` line ends are accepted as well as `\r\n`.
pub fn head_len(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find_map(|i| {
        if buf[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if buf[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

/// The answer to a complete request head: 200 with the page `metrics` renders for
/// `GET /metrics` (a query string is ignored), 404 for any other path, 405 for any other
/// method, 400 for what is not an HTTP/1.x request line, 500 with the reason if rendering
/// fails. `metrics` runs only for `GET /metrics`.
pub fn respond(head: &[u8], metrics: impl FnOnce() -> Result<String, String>) -> Response {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = &head[..line_end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Ok(line) = std::str::from_utf8(line) else {
        return Response::text(400, "bad request line\n");
    };
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Response::text(400, "bad request line\n");
    };
    if method.is_empty() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Response::text(400, "bad request line\n");
    }
    if method != "GET" {
        let mut r = Response::text(405, format!("{method} not allowed: use GET\n"));
        r.headers.push("Allow: GET".into());
        return r;
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if path != METRICS_PATH {
        return Response::text(
            404,
            format!("not found: the metrics are on {METRICS_PATH}\n"),
        );
    }
    match metrics() {
        Ok(body) => Response {
            status: 200,
            content_type: CONTENT_TYPE,
            headers: Vec::new(),
            body,
        },
        Err(e) => Response::text(500, format!("{e}\n")),
    }
}

/// What reading a request head gave.
enum HeadRead {
    Head(Vec<u8>),
    TooLarge,
    TimedOut,
    /// The client closed or failed before sending a whole head: nothing to answer.
    Gone,
}

fn read_head(stream: &mut TcpStream, limits: &Limits) -> HeadRead {
    let deadline = Instant::now() + limits.read_timeout;
    let mut buf = vec![0u8; limits.max_request_bytes];
    let mut len = 0;
    loop {
        if let Some(n) = head_len(&buf[..len]) {
            buf.truncate(n);
            return HeadRead::Head(buf);
        }
        if len == buf.len() {
            return HeadRead::TooLarge;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        // A zero timeout would mean "block forever" to set_read_timeout.
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return HeadRead::TimedOut;
        }
        match stream.read(&mut buf[len..]) {
            Ok(0) => return HeadRead::Gone,
            Ok(n) => len += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return HeadRead::TimedOut
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return HeadRead::Gone,
        }
    }
}

/// Serves one connection: one request head, one answer.
fn serve_connection(
    mut stream: TcpStream,
    limits: &Limits,
    metrics: &(dyn Fn() -> Result<String, String> + Sync),
) {
    let response = match read_head(&mut stream, limits) {
        HeadRead::Head(head) => respond(&head, metrics),
        HeadRead::TooLarge => Response::text(
            431,
            format!(
                "request head longer than {} bytes\n",
                limits.max_request_bytes
            ),
        ),
        HeadRead::TimedOut => Response::text(408, "request head not received in time\n"),
        HeadRead::Gone => return,
    };
    let _ = stream.set_write_timeout(Some(limits.write_timeout));
    if stream.write_all(&response.encode()).is_ok() {
        linger_close(stream, Duration::from_millis(500));
    }
}

/// Ends the answer and reads (and drops) what the client still sends, for at most `wait`
/// and 64 KiB, before closing: closing a socket with unread input sends a reset, which can
/// make the client lose the answer (e.g. the 431 to a request longer than we read).
fn linger_close(mut stream: TcpStream, wait: Duration) {
    if stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + wait;
    let mut scratch = [0u8; 4096];
    let mut total = 0;
    while total < 64 * 1024 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut scratch) {
            Ok(0) | Err(_) => return,
            Ok(n) => total += n,
        }
    }
}

/// The HTTP listener of `rocebus stat --listen`. See the module documentation.
#[derive(Debug)]
pub struct MetricsServer {
    listener: TcpListener,
    limits: Limits,
}

/// How often the accept loop looks at the stop flag when no client connects.
const STOP_POLL: Duration = Duration::from_millis(50);

impl MetricsServer {
    /// Binds `addr` (port 0: any free port, see [`local_addr`](Self::local_addr)).
    pub fn bind(addr: SocketAddr, limits: Limits) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        // Non-blocking accepts, so the loop sees the stop flag without a client connecting.
        listener.set_nonblocking(true)?;
        Ok(MetricsServer { listener, limits })
    }

    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` is set, then waits for the connections in progress (each is
    /// bounded by the read and write timeouts) and returns. `metrics` renders the page for
    /// each `GET /metrics`, on the connection's thread.
    pub fn serve(
        &self,
        stop: &AtomicBool,
        metrics: &(dyn Fn() -> Result<String, String> + Sync),
    ) -> io::Result<()> {
        let active = AtomicUsize::new(0);
        // Connections in progress per client address (entries removed at zero).
        let per_address: Mutex<HashMap<IpAddr, usize>> = Mutex::new(HashMap::new());
        let limits = self.limits;
        std::thread::scope(|scope| {
            // ORDERING: Relaxed; the flag publishes nothing but itself (a signal handler or
            // another thread asks us to stop; nothing else is read on its strength).
            while !stop.load(Ordering::Relaxed) {
                let (stream, peer) = match self.listener.accept() {
                    Ok(accepted) => accepted,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(STOP_POLL);
                        continue;
                    }
                    // A client that reset before we accepted it, a signal, or a transient
                    // shortage of descriptors: none of them ends the server.
                    Err(e) if is_transient(&e) => {
                        std::thread::sleep(STOP_POLL);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                // Accepted sockets do not inherit O_NONBLOCK on Linux; say so anyway, the
                // timeouts below need blocking reads.
                if stream.set_nonblocking(false).is_err() {
                    continue;
                }
                let ip = peer.ip();
                let from_ip = lock(&per_address).get(&ip).copied().unwrap_or(0);
                if from_ip >= limits.max_per_address {
                    refuse(
                        stream,
                        &format!(
                            "more than {} connections at once from {ip}\n",
                            limits.max_per_address
                        ),
                    );
                    continue;
                }
                // ORDERING: Relaxed; a plain count of threads, no data hangs off it.
                if active.load(Ordering::Relaxed) >= limits.max_connections {
                    refuse(
                        stream,
                        &format!("more than {} connections at once\n", limits.max_connections),
                    );
                    continue;
                }
                // ORDERING: Relaxed; as above.
                active.fetch_add(1, Ordering::Relaxed);
                *lock(&per_address).entry(ip).or_insert(0) += 1;
                let (active, per_address) = (&active, &per_address);
                let done = move || {
                    // ORDERING: Relaxed; as above.
                    active.fetch_sub(1, Ordering::Relaxed);
                    let mut m = lock(per_address);
                    if let Some(n) = m.get_mut(&ip) {
                        *n -= 1;
                        if *n == 0 {
                            m.remove(&ip);
                        }
                    }
                };
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn_scoped(scope, move || {
                        serve_connection(stream, &limits, metrics);
                        done();
                    });
                if spawned.is_err() {
                    // The stream went with the failed closure; its counts are given back.
                    done();
                }
            }
            Ok(())
        })
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::TimedOut
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO)
    )
}

/// The per-address counts, whatever a panicking connection thread left (they are plain
/// counts: a poisoned lock holds nothing half-changed that matters).
fn lock(m: &Mutex<HashMap<IpAddr, usize>>) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Answers 503 with `why` without reading the request (too many connections already).
fn refuse(mut stream: TcpStream, why: &str) {
    let r = Response::text(503, why);
    // On the accept loop's thread: nothing here may block for long.
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    if stream.write_all(&r.encode()).is_err() || stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    // Drop whatever request bytes have arrived (see `linger_close`), without waiting.
    if stream.set_nonblocking(true).is_ok() {
        let mut scratch = [0u8; 4096];
        for _ in 0..16 {
            if !matches!(stream.read(&mut scratch), Ok(n) if n > 0) {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Result<String, String> {
        Ok("rocebus_x_total 1\n".into())
    }

    #[test]
    fn get_metrics_is_the_page() {
        let r = respond(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", page);
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, CONTENT_TYPE);
        assert_eq!(r.body, "rocebus_x_total 1\n");
        let r = respond(b"GET /metrics?name[]=x HTTP/1.0\n\n", page);
        assert_eq!(r.status, 200);
        let wire = String::from_utf8(r.encode()).unwrap();
        assert_eq!(
            wire,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
             Content-Length: 18\r\nConnection: close\r\n\r\nrocebus_x_total 1\n"
        );
    }

    #[test]
    fn other_paths_methods_and_garbage() {
        let never = || -> Result<String, String> { panic!("rendered for a refused request") };
        assert_eq!(respond(b"GET / HTTP/1.1\r\n\r\n", never).status, 404);
        assert_eq!(
            respond(b"GET /metricsx HTTP/1.1\r\n\r\n", never).status,
            404
        );
        let r = respond(b"POST /metrics HTTP/1.1\r\n\r\n", never);
        assert_eq!(r.status, 405);
        assert_eq!(r.headers, ["Allow: GET"]);
        assert_eq!(
            respond(b"HEAD /metrics HTTP/1.1\r\n\r\n", never).status,
            405
        );
        for bad in [
            &b"\r\n\r\n"[..],
            b"GET\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET /metrics HTTP/1.1 extra\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics SPDY/3\r\n\r\n",
            b"GET /m\xff HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(respond(bad, never).status, 400, "{bad:?}");
        }
        let r = respond(b"GET /metrics HTTP/1.1\r\n\r\n", || Err("no dir".into()));
        assert_eq!((r.status, r.body.as_str()), (500, "no dir\n"));
    }

    #[test]
    fn head_ends_at_the_blank_line() {
        assert_eq!(head_len(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(head_len(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_len(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_len(b""), None);
    }

    /// A server on loopback with `limits`, stopped and joined on drop.
    struct Running {
        addr: SocketAddr,
        stop: std::sync::Arc<AtomicBool>,
        thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    }

    impl Running {
        fn start(limits: Limits) -> Running {
            let server = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), limits).unwrap();
            let addr = server.local_addr().unwrap();
            let stop = std::sync::Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let thread = std::thread::spawn(move || server.serve(&s, &page));
            Running {
                addr,
                stop,
                thread: Some(thread),
            }
        }

        fn try_request(&self, bytes: &[u8]) -> io::Result<String> {
            let mut c = TcpStream::connect(self.addr)?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            c.write_all(bytes)?;
            let mut out = String::new();
            c.read_to_string(&mut out)?;
            Ok(out)
        }

        fn request(&self, bytes: &[u8]) -> String {
            self.try_request(bytes).unwrap()
        }

        fn stop(mut self) -> io::Result<()> {
            // ORDERING: Relaxed; the flag publishes nothing but itself, and join() below
            // synchronises with the server thread.
            self.stop.store(true, Ordering::Relaxed);
            self.thread.take().unwrap().join().unwrap()
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            // ORDERING: Relaxed; as in `stop`.
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    #[test]
    fn serves_over_tcp_and_stops() {
        let s = Running::start(Limits::default());
        let out = s.request(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nrocebus_x_total 1\n"), "{out}");
        let out = s.request(b"GET /nope HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 404 "), "{out}");
        let out = s.request(b"DELETE /metrics HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 405 "), "{out}");
        assert!(out.contains("\r\nAllow: GET\r\n"), "{out}");
        s.stop().unwrap();
    }

    #[test]
    fn oversized_and_slow_requests_are_cut_off() {
        let s = Running::start(Limits {
            max_request_bytes: 64,
            read_timeout: Duration::from_millis(300),
            ..Limits::default()
        });
        // A client that never finishes its head does not hold up anyone else...
        let mut slow = TcpStream::connect(s.addr).unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
        let t = Instant::now();
        let out = s.request(b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
        assert!(
            t.elapsed() < Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        // ...and is answered 408 once its time is up.
        slow.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut out = String::new();
        slow.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        let out = s.request(&[b'x'; 100]);
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
    }

    #[test]
    fn connections_beyond_the_cap_get_503() {
        let s = Running::start(Limits {
            max_connections: 1,
            read_timeout: Duration::from_secs(10),
            ..Limits::default()
        });
        let mut held = TcpStream::connect(s.addr).unwrap();
        held.write_all(b"GET").unwrap();
        // The accept loop has to see the first connection before the second arrives.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // A refused connection may also be reset before its answer is read: try again.
            let out = s
                .try_request(b"GET /metrics HTTP/1.1\r\n\r\n")
                .unwrap_or_default();
            if out.starts_with("HTTP/1.1 503 ") {
                break;
            }
            assert!(Instant::now() < deadline, "never refused: {out}");
            std::thread::sleep(Duration::from_millis(10));
        }
        held.write_all(b" /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        held.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    }

    /// A TCP connection to `dst` from the loopback address `src` (127.0.0.0/8 is all
    /// local, so several client addresses need no set-up).
    #[allow(unsafe_code)]
    fn connect_from(src: std::net::Ipv4Addr, dst: SocketAddr) -> TcpStream {
        use std::os::fd::FromRawFd;
        let sin = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let SocketAddr::V4(dst) = dst else {
            panic!("IPv4 only")
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: socket() has no preconditions; the descriptor is checked below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: fd is a socket nobody else owns; the TcpStream closes it once.
        let stream = unsafe { TcpStream::from_raw_fd(fd) };
        let (from, to) = (sin(src, 0), sin(*dst.ip(), dst.port()));
        // SAFETY: `from` is a valid sockaddr_in of `len` bytes, alive for the call.
        let rc = unsafe { libc::bind(fd, (&from as *const libc::sockaddr_in).cast(), len) };
        assert_eq!(rc, 0, "bind {src}: {}", io::Error::last_os_error());
        // SAFETY: as above, for `to`.
        let rc = unsafe { libc::connect(fd, (&to as *const libc::sockaddr_in).cast(), len) };
        assert_eq!(rc, 0, "connect: {}", io::Error::last_os_error());
        stream
    }

    fn scrape_from(src: std::net::Ipv4Addr, dst: SocketAddr) -> String {
        let mut c = connect_from(src, dst);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    /// Sixteen slow connections from one address (the global cap) with a long read
    /// deadline: a scraper from another address is still answered 200, and the slow
    /// address is answered 503 beyond its share.
    #[test]
    fn one_address_holding_slow_connections_cannot_keep_the_scraper_out() {
        let limits = Limits {
            read_timeout: Duration::from_secs(10),
            ..Limits::default()
        };
        let s = Running::start(limits);
        let attacker = std::net::Ipv4Addr::new(127, 0, 0, 2);
        let slow: Vec<TcpStream> = (0..limits.max_connections)
            .map(|_| {
                let mut c = connect_from(attacker, s.addr);
                c.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
                c
            })
            .collect();
        // Let the accept loop take them all in.
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let out = scrape_from(std::net::Ipv4Addr::new(127, 0, 0, 1), s.addr);
        assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let out = scrape_from(attacker, s.addr);
        assert!(out.starts_with("HTTP/1.1 503 "), "{out}");
        assert!(out.contains("from 127.0.0.2"), "{out}");
        drop(slow);
    }

    /// With the default limits, slow connections from the scraper's own address are cut
    /// by the short read deadline: the scraper, retrying as Prometheus does at its next
    /// interval, is answered 200 within about one deadline.
    #[test]
    fn slow_connections_from_the_scrapers_own_address_are_cut_short() {
        let s = Running::start(Limits::default());
        let me = std::net::Ipv4Addr::new(127, 0, 0, 3);
        let _slow: Vec<TcpStream> = (0..16)
            .map(|_| {
                let mut c = connect_from(me, s.addr);
                c.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
                c
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        loop {
            let out = scrape_from(me, s.addr);
            if out.starts_with("HTTP/1.1 200 ") {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "no 200 within 3 s: {out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
