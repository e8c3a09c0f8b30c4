//! Frame and handshake wire formats of the orders ring (little-endian:
//! rocebus's own frames use the byte order of every host it runs on, so
//! encoding is a plain store).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Frames start on 16-byte boundaries; a frame's total size is a multiple
/// of 16, so the space left before the ring's end is always 0 or room for
/// at least a header (which a padding frame then fills).
pub const FRAME_ALIGN: usize = 16;

/// Bytes of frame header: one word (length, stream, type).
pub const HEADER_LEN: usize = 8;

/// Bytes of frame trailer (the seal: [`trailer_value`] of the sequence and
/// the header's word).
pub const TRAILER_LEN: usize = 8;

/// The trailer sealing frame `seq` whose header word is `word0`: both
/// mixed (a bijection of the sequence for any one header word, so two
/// frames with the same header never share a seal), so that bytes left in
/// the ring by an earlier lap, a header of an earlier lap included, are
/// unlikely to look like it. It is what tells a frame from leftovers: the
/// header word is read first, tells where the seal is, and counts only
/// when the seal there is the one of this sequence *and* this header.
#[inline]
pub const fn trailer_value(seq: u64, word0: u64) -> u64 {
    (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ word0).wrapping_mul(0xD6E8_FEB8_6659_FD93)
        ^ 0x5EA1_ED0F_F5E7_0000
}

/// The header word of a frame: the payload length in the low 32 bits, the
/// stream in the next 16, the type in the top 16 (the little-endian bytes
/// of [`FrameHeader`]). The one place that layout is written down: the
/// sender's hot path, [`FrameHeader::word0`] and the receiver's fast path
/// (which reads the fields back with [`word_len`], [`word_stream`] and
/// [`word_type`]) all use it.
#[inline(always)]
pub const fn header_word(len: u32, stream_id: u16, msg_type: u16) -> u64 {
    len as u64 | (stream_id as u64) << 32 | (msg_type as u64) << 48
}
/// The payload length a [`header_word`] carries.
#[inline(always)]
pub const fn word_len(word0: u64) -> u32 {
    word0 as u32
}
/// The stream a [`header_word`] carries.
#[inline(always)]
pub const fn word_stream(word0: u64) -> u16 {
    (word0 >> 32) as u16
}
/// The message type a [`header_word`] carries.
#[inline(always)]
pub const fn word_type(word0: u64) -> u16 {
    (word0 >> 48) as u16
}

/// The message type of a padding frame (fills the ring's tail on wrap).
pub const TYPE_PADDING: u16 = 0xFFFF;
/// Types from here up are reserved for rocebus itself.
pub const TYPE_RESERVED_MIN: u16 = 0xFF00;

/// The header in front of every frame in the ring: one little-endian word.
/// It carries no check of its own: the frame's seal covers it (see
/// [`trailer_value`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct FrameHeader {
    /// Payload length in bytes (the frame occupies `frame_len(len)` bytes).
    pub len: U32,
    /// Stream the message belongs to (several streams share a connection).
    pub stream_id: U16,
    /// Application message type (`TYPE_PADDING` for padding).
    pub msg_type: U16,
}

impl FrameHeader {
    /// A header.
    pub fn new(len: u32, stream_id: u16, msg_type: u16) -> Self {
        FrameHeader {
            len: len.into(),
            stream_id: stream_id.into(),
            msg_type: msg_type.into(),
        }
    }
    /// The header read from its word.
    pub fn from_word(word0: u64) -> Self {
        Self::new(word_len(word0), word_stream(word0), word_type(word0))
    }
    /// The header's bytes (length, stream, type) as one little-endian word.
    pub fn word0(&self) -> u64 {
        header_word(self.len.get(), self.stream_id.get(), self.msg_type.get())
    }
    /// The seal of frame `seq` with this header.
    pub fn seal(&self, seq: u64) -> u64 {
        trailer_value(seq, self.word0())
    }
}
const _: () = assert!(std::mem::size_of::<FrameHeader>() == HEADER_LEN);

/// Total ring bytes of a frame with `payload` bytes: header, payload,
/// trailer, rounded up to [`FRAME_ALIGN`] (the trailer is always the last
/// 8 bytes). A 64-byte payload takes 80 bytes; a padding frame with no
/// payload, 16.
#[inline]
pub const fn frame_len(payload: usize) -> usize {
    (HEADER_LEN + payload + TRAILER_LEN + FRAME_ALIGN - 1) & !(FRAME_ALIGN - 1)
}

/// Writes frame `seq` carrying `payload` into `frame`, the bytes it
/// occupies ([`frame_len`] of the payload): header, payload, then the seal
/// in the last 8 bytes. Panics if `frame` cannot hold them (the caller
/// claimed exactly this room).
#[inline]
pub fn write_frame(frame: &mut [u8], stream_id: u16, msg_type: u16, seq: u64, payload: &[u8]) {
    let word0 = header_word(payload.len() as u32, stream_id, msg_type);
    let (head, rest) = frame
        .split_first_chunk_mut::<HEADER_LEN>()
        .expect("a frame holds a header");
    *head = word0.to_le_bytes();
    let (body, seal) = rest
        .split_last_chunk_mut::<TRAILER_LEN>()
        .expect("a frame holds a seal");
    copy_small(&mut body[..payload.len()], payload);
    *seal = trailer_value(seq, word0).to_le_bytes();
}

/// `dst.copy_from_slice(src)` (equal lengths), without a call for the
/// usual order sizes: 16 to 64 bytes are two fixed-size copies that
/// overlap in the middle (what `memcpy` does after its dispatch).
#[inline(always)]
fn copy_small(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if dst.len() != n || !(16..=64).contains(&n) {
        dst.copy_from_slice(src);
    } else if n <= 32 {
        dst[..16].copy_from_slice(&src[..16]);
        dst[n - 16..].copy_from_slice(&src[n - 16..]);
    } else {
        dst[..32].copy_from_slice(&src[..32]);
        dst[n - 32..].copy_from_slice(&src[n - 32..]);
    }
}

/// Why a frame (or the producer position) read from the ring is refused.
/// Any of these means the peer is broken or hostile: the connection is
/// closed, nothing past the bad frame is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A frame longer than the space to the ring's end or than the
    /// connection's maximum.
    #[error("frame at {pos} has impossible length {len}")]
    BadLength {
        /// Ring position.
        pos: u64,
        /// Payload length claimed.
        len: u32,
    },
    /// A reserved message type other than padding, or padding that does not
    /// end exactly at the ring's end.
    #[error("frame at {pos} has impossible type {msg_type:#x}")]
    BadType {
        /// Ring position.
        pos: u64,
        /// Type claimed.
        msg_type: u16,
    },
}

/// What a frame header says, once validated against the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    /// Payload length.
    pub len: u32,
    /// Stream id.
    pub stream_id: u16,
    /// Message type.
    pub msg_type: u16,
    /// Sequence.
    pub seq: u64,
    /// Total bytes the frame occupies.
    pub total: usize,
}

/// Looks at the header word found at ring position `pos` (offset `off`
/// in a ring of `ring_size`) while frame `expected_seq` is awaited there,
/// and says where that frame's seal would be. `None`: no frame of this
/// length fits before the ring's end, so the word is not a header (bytes
/// of an earlier lap, or zeros): the frame has not arrived. Else
/// `Some((total, verdict))`: the header counts only if the word at
/// `off + total - TRAILER_LEN` is [`FrameHeader::seal`] of the expected
/// sequence (the caller loads it, with Acquire); if it is, `verdict` is
/// the frame, or why a sealed header is impossible (a reserved type other
/// than padding, padding that does not end at the ring's end, a payload
/// over `max_payload`). Pure function.
///
/// A peer that writes a header whose length runs past the ring's end
/// cannot seal it: the receiver sees no frame, and the connection carries
/// nothing more from that peer (which then stalls only itself).
pub fn validate(
    h: &FrameHeader,
    pos: u64,
    off: usize,
    ring_size: usize,
    expected_seq: u64,
    max_payload: usize,
) -> Option<(usize, Result<FrameInfo, FrameError>)> {
    let seq = expected_seq;
    let len = h.len.get();
    let msg_type = h.msg_type.get();
    let to_end = ring_size - off;
    // `len` is a u32: `frame_len` cannot overflow.
    let total = frame_len(len as usize);
    if total > to_end {
        return None;
    }
    let verdict = if msg_type == TYPE_PADDING && total != to_end
        || msg_type != TYPE_PADDING && msg_type >= TYPE_RESERVED_MIN
    {
        // A padding frame fills the ring to its end.
        Err(FrameError::BadType { pos, msg_type })
    } else if msg_type != TYPE_PADDING && len as usize > max_payload {
        Err(FrameError::BadLength { pos, len })
    } else {
        Ok(FrameInfo {
            len,
            stream_id: h.stream_id.get(),
            msg_type,
            seq,
            total,
        })
    };
    Some((total, verdict))
}

/// Magic of the connection handshake ("RBO4": the initiator proves first,
/// in its connect request; a peer still sending "RBO3" (the responder
/// proved first), "RBO2" or "RBO1" is refused silently, like a stranger).
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"RBO4");

/// What each side tells the other about its incoming ring. 32 bytes; both
/// hellos, as sent, are the context the challenge-response binds
/// ([`crate::auth`]), so neither can be altered on the way unnoticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Hello {
    /// [`HELLO_MAGIC`].
    pub magic: U32,
    /// log2 of the ring's data size.
    pub ring_log2: U16,
    /// [`FLAG_FANIN`] or zero; other bits reserved, zero.
    pub flags: U16,
    /// Address of the ring region (data, then the control words).
    pub ring_addr: U64,
    /// Its rkey.
    pub ring_rkey: U32,
    /// Largest payload the receiver accepts.
    pub max_payload: U32,
    /// Random per-connection id (diagnostics).
    pub conn_id: U64,
}
const _: () = assert!(std::mem::size_of::<Hello>() == 32);

/// The connect request's private data: the initiator's hello, the second
/// half of its nonce and its first proof. 56 bytes, all a connect request
/// can carry.
///
/// The initiator's 16-byte nonce `Ni` is its hello's `conn_id` (8 random
/// bytes, not a counter, from an initiator) followed by `nonce_tail`
/// ([`ConnectHello::nonce`]). `proof` is
/// [`Initiator::first_proof`](crate::auth::Initiator::first_proof) over the
/// hello's 32 bytes and, when [`FLAG_COOKIE`] is set, the cookie the
/// listener handed out: a listener checks it before it answers, allocates
/// or counts anything, and refuses a wrong one with no private data at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ConnectHello {
    /// The initiator's ring; `conn_id` is the first half of `Ni`.
    pub hello: Hello,
    /// The second half of the initiator's fresh nonce `Ni`.
    pub nonce_tail: [u8; 8],
    /// The initiator's first proof (see above).
    pub proof: [u8; crate::auth::TAG_LEN],
}
const _: () = assert!(std::mem::size_of::<ConnectHello>() == 56);

impl ConnectHello {
    /// The initiator's nonce `Ni`: `conn_id`'s bytes, then `nonce_tail`.
    pub fn nonce(&self) -> crate::auth::Nonce {
        let mut n = [0u8; crate::auth::NONCE_LEN];
        n[..8].copy_from_slice(self.hello.conn_id.as_bytes());
        n[8..].copy_from_slice(&self.nonce_tail);
        n
    }

    /// Splits `nonce` into the hello's `conn_id` and `nonce_tail`.
    pub fn set_nonce(&mut self, nonce: &crate::auth::Nonce) {
        let mut head = [0u8; 8];
        head.copy_from_slice(&nonce[..8]);
        self.hello.conn_id = U64::from_bytes(head);
        self.nonce_tail.copy_from_slice(&nonce[8..]);
    }
}

/// [`Hello::flags`] bit of a connect request: its proof covers the cookie
/// of a [`CookieReply`](crate::admission::CookieReply) (the cookie itself does not travel again: the
/// listener recomputes it from the request's address and the time).
pub const FLAG_COOKIE: u16 = 2;

/// The accept reply's private data, sent only to an initiator whose first
/// proof checked out: the responder's hello, its nonce and its proof `Tr`
/// that it knows the secret. 64 bytes (a reply carries 196).
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct AcceptHello {
    /// The responder's ring.
    pub hello: Hello,
    /// The responder's fresh nonce `Nr`.
    pub nonce: [u8; crate::auth::NONCE_LEN],
    /// `Tr`, see [`crate::auth`].
    pub proof: [u8; crate::auth::TAG_LEN],
}
const _: () = assert!(std::mem::size_of::<AcceptHello>() == 64);

/// Bytes after a ring's data: the credit word (16 bytes at 0) and the
/// proof slot (32 bytes at [`PROOF_OFF`]); registered with the ring.
pub const CONTROL_LEN: usize = 64;
/// Offset, after the ring's data, of the slot the initiator writes its
/// proof `Ti` into (one inline RDMA WRITE, before any frame).
pub const PROOF_OFF: usize = 32;
/// Bytes of the proof slot as written: the tag, [`PROOF_SEAL`], 8 zeros.
pub const PROOF_LEN: usize = 32;
/// The word that follows a complete proof in its slot (the tag's bytes are
/// placed before it).
pub const PROOF_SEAL: u64 = u64::from_le_bytes(*b"RBPROOF1");

/// The proof slot's bytes as the initiator writes them.
pub fn proof_bytes(tag: &crate::auth::Tag) -> [u8; PROOF_LEN] {
    let mut b = [0u8; PROOF_LEN];
    b[..crate::auth::TAG_LEN].copy_from_slice(tag);
    b[crate::auth::TAG_LEN..crate::auth::TAG_LEN + 8].copy_from_slice(&PROOF_SEAL.to_le_bytes());
    b
}

/// The context both proofs bind: the initiator's hello, then the
/// responder's, as they travelled.
pub fn handshake_context(initiator: &Hello, responder: &Hello) -> [u8; 64] {
    let mut ctx = [0u8; 64];
    ctx[..32].copy_from_slice(initiator.as_bytes());
    ctx[32..].copy_from_slice(responder.as_bytes());
    ctx
}

/// [`Hello::flags`] bit. From the initiator: it will mark a fan-in slot
/// if granted one. From the responder: a [`FanInGrant`] follows its
/// [`AcceptHello`] in the accept reply. Both hellos, flags included, are
/// bound by the handshake's proofs, and so is the grant
/// ([`handshake_context_with`]).
pub const FLAG_FANIN: u16 = 1;

/// The fan-in slot a listener grants an initiator: after each flush the
/// initiator writes one nonzero byte to `addr` with `rkey` (a region
/// covering that byte only). 16 bytes, after the [`AcceptHello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct FanInGrant {
    /// Address of the slot's byte in the listener's activity summary.
    pub addr: U64,
    /// rkey of the region covering that byte.
    pub rkey: U32,
    /// Slot index (diagnostics; the address is what is written).
    pub slot: U32,
}
const _: () = assert!(std::mem::size_of::<FanInGrant>() == 16);

/// Bytes of an accept reply carrying a [`FanInGrant`].
pub const ACCEPT_FANIN_LEN: usize = std::mem::size_of::<AcceptHello>() + 16;

/// The context both proofs bind, with the fan-in grant when there is one:
/// the two hellos, then the grant's 16 bytes.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeContext {
    bytes: [u8; 80],
    len: usize,
}

impl HandshakeContext {
    /// The bytes the proofs are computed over.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// [`handshake_context`], followed by `grant`'s bytes if any.
pub fn handshake_context_with(
    initiator: &Hello,
    responder: &Hello,
    grant: Option<&FanInGrant>,
) -> HandshakeContext {
    let mut bytes = [0u8; 80];
    bytes[..64].copy_from_slice(&handshake_context(initiator, responder));
    let len = match grant {
        Some(g) => {
            bytes[64..].copy_from_slice(g.as_bytes());
            80
        }
        None => 64,
    };
    HandshakeContext { bytes, len }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Frame 1 carrying 5 payload bytes (1..=5) on stream 7, type 3, as it
    // sits in the ring: header word, payload, zero padding, seal (computed
    // independently from the formula).
    static FRAME_BYTES: [u8; 32] = [
        5, 0, 0, 0, 7, 0, 3, 0, // length, stream, type
        1, 2, 3, 4, 5, 0, 0, 0, // payload, padding
        0, 0, 0, 0, 0, 0, 0, 0, // padding
        48, 13, 22, 192, 12, 203, 39, 127, // seal
    ];

    #[test]
    fn frame_fixed_bytes() {
        let h = FrameHeader::read_from_bytes(&FRAME_BYTES[..8]).unwrap();
        assert_eq!(
            (h.len.get(), h.stream_id.get(), h.msg_type.get()),
            (5, 7, 3)
        );
        assert_eq!(FrameHeader::new(5, 7, 3).as_bytes(), &FRAME_BYTES[..8]);
        assert_eq!(FrameHeader::from_word(h.word0()), h);
        // The word is the header's little-endian bytes, field by field.
        let w = u64::from_le_bytes(FRAME_BYTES[..8].try_into().unwrap());
        assert_eq!(h.word0(), w);
        assert_eq!(header_word(5, 7, 3), w);
        assert_eq!((word_len(w), word_stream(w), word_type(w)), (5, 7, 3));
        let top = header_word(u32::MAX, 0xABCD, TYPE_PADDING);
        assert_eq!(
            FrameHeader::from_word(top).as_bytes(),
            &top.to_le_bytes()[..]
        );
        assert_eq!(h.seal(1).to_le_bytes(), FRAME_BYTES[24..]);
        let mut f = [0u8; 32];
        write_frame(&mut f, 7, 3, 1, &[1, 2, 3, 4, 5]);
        assert_eq!(f, FRAME_BYTES);
        assert_eq!(frame_len(5), 32);
        assert_eq!(frame_len(0), 16);
        assert_eq!(frame_len(8), 32);
        assert_eq!(frame_len(16), 32);
        assert_eq!(frame_len(17), 48);
        assert_eq!(frame_len(64), 80);
        // The seal binds the sequence and every header field.
        assert_ne!(h.seal(1), h.seal(2));
        assert_ne!(h.seal(1), FrameHeader::new(6, 7, 3).seal(1));
        assert_ne!(h.seal(1), FrameHeader::new(5, 8, 3).seal(1));
        assert_ne!(h.seal(1), FrameHeader::new(5, 7, 4).seal(1));
        assert_ne!(trailer_value(1, 0), 0);
    }

    fn hdr(len: u32, t: u16) -> FrameHeader {
        FrameHeader::new(len, 1, t)
    }

    #[test]
    fn validation_rejects_impossible_frames() {
        let (total, ok) = validate(&hdr(5, 3), 0, 0, 1024, 9, 512).unwrap();
        assert_eq!((total, ok.unwrap().total, ok.unwrap().seq), (32, 32, 9));
        // Zeros: a frame with no payload, whose seal decides.
        let zeros = FrameHeader::read_from_bytes(&[0u8; 8][..]).unwrap();
        assert_eq!(validate(&zeros, 0, 0, 1024, 9, 512).unwrap().0, 16);
        // Past the ring's end, or a huge length (which would overflow
        // naive arithmetic): no seal can exist, so not a header.
        assert_eq!(validate(&hdr(40, 3), 992, 992, 1024, 9, 512), None);
        assert_eq!(validate(&hdr(u32::MAX, 3), 0, 0, 1024, 9, 512), None);
        assert_eq!(validate(&hdr(2000, 3), 0, 0, 1024, 9, 512), None);
        // Sealed but over max payload.
        assert!(matches!(
            validate(&hdr(600, 3), 0, 0, 1024, 9, 512),
            Some((624, Err(FrameError::BadLength { len: 600, .. })))
        ));
        // Reserved type.
        assert!(matches!(
            validate(&hdr(5, 0xFF01), 0, 0, 1024, 9, 512),
            Some((32, Err(FrameError::BadType { .. })))
        ));
        // Padding that does not end exactly at the ring's end.
        assert!(matches!(
            validate(&hdr(0, TYPE_PADDING), 0, 0, 1024, 9, 512),
            Some((16, Err(FrameError::BadType { .. })))
        ));
        // Padding that does (its length is not held to max payload), even
        // a bare header and seal.
        let (total, p) = validate(&hdr(1008, TYPE_PADDING), 0, 0, 1024, 9, 512).unwrap();
        assert_eq!((total, p.unwrap().total), (1024, 1024));
        let (total, p) = validate(&hdr(0, TYPE_PADDING), 1008, 1008, 1024, 9, 512).unwrap();
        assert_eq!((total, p.unwrap().total), (16, 16));
    }

    // An initiator's connect data as it travels: magic "RBO4", ring 2^20,
    // flags (cookie), address, rkey, max payload, id (the nonce's first
    // half), the nonce's second half, then the first proof.
    static CONNECT_BYTES: [u8; 56] = [
        b'R', b'B', b'O', b'4', 20, 0, 2, 0, // magic, ring_log2, flags
        0, 0x10, 0, 0, 0, 0x7f, 0, 0, // ring_addr
        0x34, 0x12, 0, 0, 0, 0, 1, 0, // rkey, max_payload
        1, 2, 3, 4, 5, 6, 7, 8, // conn_id: nonce 1..=8
        9, 10, 11, 12, 13, 14, 15, 16, // nonce 9..=16
        0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, // proof
        0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
    ];

    #[test]
    fn hello_fixed_bytes_and_context() {
        let h = Hello {
            magic: HELLO_MAGIC.into(),
            ring_log2: 20.into(),
            flags: FLAG_COOKIE.into(),
            ring_addr: 0x7f00_0000_1000.into(),
            ring_rkey: 0x1234.into(),
            max_payload: 65536.into(),
            conn_id: 0.into(),
        };
        let mut c = ConnectHello {
            hello: h,
            nonce_tail: [0; 8],
            proof: std::array::from_fn(|i| 0xa0 + i as u8),
        };
        let nonce: crate::auth::Nonce = std::array::from_fn(|i| i as u8 + 1);
        c.set_nonce(&nonce);
        assert_eq!(c.nonce(), nonce);
        assert_eq!(c.as_bytes(), &CONNECT_BYTES);
        let h = c.hello;
        assert_eq!(
            ConnectHello::read_from_bytes(&CONNECT_BYTES[..]).unwrap(),
            c
        );
        let mut r = h;
        r.conn_id = 43.into();
        let ctx = handshake_context(&h, &r);
        assert_eq!(&ctx[..32], h.as_bytes());
        assert_eq!(&ctx[32..], r.as_bytes());
        assert_ne!(handshake_context(&r, &h), ctx);
    }

    // A fan-in grant as it follows the accept hello: address, rkey, slot.
    static GRANT_BYTES: [u8; 16] = [
        0x08, 0x10, 0, 0, 0, 0x7f, 0, 0, // addr
        0x78, 0x56, 0, 0, // rkey
        5, 0, 0, 0, // slot
    ];

    #[test]
    fn fanin_grant_fixed_bytes_and_bound_context() {
        let g = FanInGrant {
            addr: 0x7f00_0000_1008.into(),
            rkey: 0x5678.into(),
            slot: 5.into(),
        };
        assert_eq!(g.as_bytes(), &GRANT_BYTES);
        assert_eq!(FanInGrant::read_from_bytes(&GRANT_BYTES[..]).unwrap(), g);
        assert_eq!(ACCEPT_FANIN_LEN, 80);
        let h = Hello::read_from_bytes(&CONNECT_BYTES[..32]).unwrap();
        let mut r = h;
        r.flags = FLAG_FANIN.into();
        // Without a grant: exactly the old 64-byte context.
        let plain = handshake_context_with(&h, &r, None);
        assert_eq!(plain.as_bytes(), &handshake_context(&h, &r)[..]);
        // With one: the grant is bound too, so changing it changes the proofs.
        let with = handshake_context_with(&h, &r, Some(&g));
        assert_eq!(&with.as_bytes()[64..], &GRANT_BYTES);
        let mut g2 = g;
        g2.addr = 0x7f00_0000_1009.into();
        assert_ne!(
            handshake_context_with(&h, &r, Some(&g2)).as_bytes(),
            with.as_bytes()
        );
    }
}
