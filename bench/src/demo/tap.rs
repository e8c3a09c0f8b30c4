//! The market-data latency probe of the demo engine: the kernel's receive time of each
//! exchange packet, matched to the normalized messages it produced.
//!
//! The feed handler's normalized messages carry the exchange timestamp (nanoseconds since
//! midnight, exchange time) but not when the packet reached this host. A raw IPv4/UDP socket
//! sees a copy of every UDP datagram the host receives, including the MoldUDP64 packets the
//! feed handler reads from its multicast group, and the kernel stamps each on arrival
//! (`SO_TIMESTAMPNS`, CLOCK_REALTIME). [`StampTable`] remembers that stamp per ITCH
//! timestamp (unique per message in a feed); a normalized message names its ITCH timestamp,
//! so the engine's handler looks the stamp up and reads CLOCK_REALTIME: the latency from the
//! exchange packet's arrival at the host (which the feed handler reads) to the engine's
//! handler. Raw sockets need CAP_NET_RAW (root in the soft-RoCE guest); without it the probe
//! is off and the report says so.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, OwnedFd};

use feed_handler::moldudp64::Packet;
use socket2::{Domain, Protocol, Socket, Type};

/// Receive stamps by ITCH timestamp: a fixed open-addressed table (no allocation after
/// construction); a newer entry overwrites an older one in its slot.
#[derive(Debug, Clone)]
pub struct StampTable {
    slots: Vec<(u64, u64)>,
    mask: usize,
}

impl StampTable {
    /// A table of `2^bits` slots.
    pub fn new(bits: u32) -> StampTable {
        StampTable {
            slots: vec![(u64::MAX, 0); 1 << bits],
            mask: (1 << bits) - 1,
        }
    }

    fn slot(&self, itch_ts: u64) -> usize {
        (itch_ts.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20) as usize & self.mask
    }

    /// Remembers that the message with `itch_ts` arrived at `received_ns`.
    pub fn insert(&mut self, itch_ts: u64, received_ns: u64) {
        let i = self.slot(itch_ts);
        self.slots[i] = (itch_ts, received_ns);
    }

    /// The arrival time of the message with `itch_ts`, if still known.
    pub fn get(&self, itch_ts: u64) -> Option<u64> {
        let (ts, at) = self.slots[self.slot(itch_ts)];
        (ts == itch_ts).then_some(at)
    }

    /// Records every ITCH message of a MoldUDP64 `payload` received at `received_ns`;
    /// returns how many (0 for a heartbeat or bytes that are not MoldUDP64).
    pub fn record_packet(&mut self, payload: &[u8], received_ns: u64) -> usize {
        let Ok(p) = Packet::parse(payload) else {
            return 0;
        };
        let mut n = 0;
        for m in p.messages() {
            if let Some(ts) = itch_timestamp(m) {
                self.insert(ts, received_ns);
                n += 1;
            }
        }
        n
    }
}

/// The UDP payload of a raw IPv4 packet sent to `dest` (None for anything else).
pub fn udp_payload_to(packet: &[u8], dest: SocketAddrV4) -> Option<&[u8]> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    if packet.first()? >> 4 != 4 || ihl < 20 || packet.get(9)? != &17 {
        return None;
    }
    if packet.get(16..20)? != dest.ip().octets() {
        return None;
    }
    let udp = packet.get(ihl..)?;
    if udp.get(2..4)? != dest.port().to_be_bytes() {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    udp.get(8..len.max(8).min(udp.len()))
}

/// Stamps queued between the probe's thread and the engine (ITCH messages in flight).
const QUEUE: usize = 1 << 16;

/// The probe: a thread blocked on a raw socket that sees the host's incoming UDP datagrams
/// with the kernel's receive stamps, and hands `(ITCH timestamp, stamp)` pairs to the engine
/// through a bounded, preallocated queue. The engine's loop drains it without system calls
/// or locks ([`ExchangeTap::drain`]); the stamps come from the kernel, so when the thread
/// reads them does not change them.
#[derive(Debug)]
pub struct ExchangeTap {
    rx: std::sync::mpsc::Receiver<(u64, u64)>,
    /// Stamps the queue could not take (engine behind), counted by the thread.
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl ExchangeTap {
    /// Opens the probe for datagrams sent to `dest` (the feed's group and port) and starts
    /// its thread. The thread ends with the process (or when the tap is dropped and the
    /// next datagram arrives).
    pub fn open(dest: SocketAddrV4) -> io::Result<ExchangeTap> {
        let s = Socket::new(
            Domain::IPV4,
            Type::from(libc::SOCK_RAW),
            Some(Protocol::UDP),
        )?;
        s.set_recv_buffer_size(4 << 20)?;
        let fd = OwnedFd::from(s);
        enable_timestamps(&fd)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let lost = std::sync::Arc::clone(&dropped);
        std::thread::Builder::new()
            .name("md-latency-probe".into())
            .spawn(move || {
                let mut buf = vec![0u8; 65536];
                loop {
                    let (len, at) = match recv_stamped(&fd, &mut buf) {
                        Ok(Some(got)) => got,
                        Ok(None) => continue,
                        Err(e) => {
                            eprintln!("sample-engine: market-data latency probe stopped: {e}");
                            return;
                        }
                    };
                    let Some(payload) = udp_payload_to(&buf[..len], dest) else {
                        continue;
                    };
                    let Ok(p) = Packet::parse(payload) else {
                        continue;
                    };
                    for m in p.messages() {
                        let Some(ts) = itch_timestamp(m) else {
                            continue;
                        };
                        match tx.try_send((ts, at)) {
                            Ok(()) => {}
                            Err(std::sync::mpsc::TrySendError::Full(_)) => {
                                // ORDERING: Relaxed; a statistic, read after the run.
                                lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return,
                        }
                    }
                }
            })?;
        Ok(ExchangeTap { rx, dropped })
    }

    /// Moves the stamps that arrived into `table`; returns how many. Never blocks.
    pub fn drain(&self, table: &mut StampTable) -> usize {
        let mut n = 0;
        while let Ok((ts, at)) = self.rx.try_recv() {
            table.insert(ts, at);
            n += 1;
        }
        n
    }

    /// Stamps lost because the engine did not drain the queue in time.
    pub fn dropped(&self) -> u64 {
        // ORDERING: Relaxed; a statistic.
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The timestamp of an ITCH message: type (1), stock locate (2), tracking number (2), then
/// 6 bytes big-endian.
fn itch_timestamp(m: &[u8]) -> Option<u64> {
    let ts = m.get(5..11)?;
    let mut b = [0u8; 8];
    b[2..].copy_from_slice(ts);
    Some(u64::from_be_bytes(b))
}

#[allow(unsafe_code)]
fn enable_timestamps(fd: &OwnedFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a live c_int and the length passed is its size; the fd is open
    // (owned by the caller for the duration of the call).
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for one datagram into `buf`; returns it with its kernel receive stamp
/// (CLOCK_REALTIME ns; 0 if the kernel gave none). `None` never comes from a blocking
/// socket except after an interrupted call.
#[allow(unsafe_code)]
fn recv_stamped(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<(usize, u64)>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // u64 words: the control buffer is aligned for cmsghdr.
    let mut control = [0u64; 16];
    // SAFETY: msghdr is plain data for which all-zero bytes are a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (which covers `buf`) and `control`, all live and
    // exclusively borrowed for the call; the kernel writes at most their given lengths.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    let mut stamp = 0;
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR/CMSG_NXTHDR only return headers
    // inside the `msg_controllen` bytes the kernel wrote, and SCM_TIMESTAMPNS data is a
    // timespec (read unaligned, as the macros promise no alignment for the data).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec =
                    std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                stamp = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some((n as usize, stamp)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use feed_handler::moldudp64::PacketBuilder;

    #[test]
    fn table_keeps_stamps_by_itch_timestamp() {
        let mut t = StampTable::new(4);
        t.insert(1000, 5);
        t.insert(2000, 6);
        assert_eq!(t.get(1000), Some(5));
        assert_eq!(t.get(2000), Some(6));
        assert_eq!(t.get(3000), None);
        // Many more than slots: old entries are overwritten, never confused.
        for ts in 0..1000u64 {
            t.insert(ts * 7 + 1, ts);
        }
        assert_eq!(t.get(999 * 7 + 1), Some(999));
        let hits = (0..1000u64)
            .filter(|ts| t.get(ts * 7 + 1) == Some(*ts))
            .count();
        assert!(hits <= 16);
        assert!((0..1000u64).all(|ts| t.get(ts * 7 + 1).is_none_or(|v| v == ts)));
    }

    /// An IPv4/UDP packet, as a raw socket returns it: 20-byte header, 8-byte UDP header.
    fn ip_udp(dest: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 1, 17, 0, 0, 198, 18, 0, 1];
        p.extend_from_slice(&dest.ip().octets());
        p.extend_from_slice(&[0x12, 0x34]);
        p.extend_from_slice(&dest.port().to_be_bytes());
        p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn records_each_itch_message_of_a_moldudp64_packet_sent_to_the_feed() {
        let feed: SocketAddrV4 = "239.1.1.1:26477".parse().unwrap();
        // Two ITCH messages (only the first 11 bytes matter here): timestamps 7 and 0x0102.
        let m1 = [b'A', 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 9, 9];
        let m2 = [b'D', 0, 1, 0, 0, 0, 0, 0, 0, 1, 2];
        let mut b = PacketBuilder::new(1400);
        b.start(*b"ROCEBUS001", 1);
        b.push(&m1).unwrap();
        b.push(&m2).unwrap();
        let payload = b.bytes().to_vec();
        let raw = ip_udp(feed, &payload);
        assert_eq!(udp_payload_to(&raw, feed), Some(&payload[..]));
        let other: SocketAddrV4 = "239.1.1.1:9".parse().unwrap();
        assert_eq!(udp_payload_to(&raw, other), None);
        assert_eq!(udp_payload_to(&raw[..10], feed), None);
        let mut t = StampTable::new(8);
        assert_eq!(t.record_packet(&payload, 42), 2);
        assert_eq!((t.get(7), t.get(0x0102)), (Some(42), Some(42)));
        assert_eq!(t.record_packet(b"not moldudp64", 1), 0);
    }
}
