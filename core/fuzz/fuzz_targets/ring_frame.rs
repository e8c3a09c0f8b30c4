//! Orders-ring frame validation on an arbitrary ring image: walking the ring the way the
//! consumer does never panics, and every frame taken (`validate` accepts it and its seal is
//! the expected sequence's for that header) lies inside the ring, aligned.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocebus::ring::frame::{validate, FrameHeader, FRAME_ALIGN, HEADER_LEN, TRAILER_LEN};
use zerocopy::FromBytes;

fuzz_target!(|data: &[u8]| {
    // 12 bytes of parameters, then the ring's data area.
    let Some((params, ring)) = data.split_first_chunk::<12>() else {
        return;
    };
    let word =
        |i: usize| u32::from_le_bytes([params[i], params[i + 1], params[i + 2], params[i + 3]]);
    // The largest power of two that fits, as the ring sizes are.
    let ring_size = match ring.len().checked_ilog2() {
        Some(log) if (1usize << log) >= HEADER_LEN => 1usize << log,
        _ => return,
    };
    let ring = &ring[..ring_size];
    // At most one lap: the consumer never reads past what it has not freed.
    let mut left = ring_size as u64;
    let first_seq = u64::from(word(0));
    let max_payload = word(4) as usize;
    // The consumer may be anywhere in the ring's history, on a frame boundary.
    let mut pos = u64::from(word(8)) * FRAME_ALIGN as u64;
    let mut seq = first_seq;
    while left >= HEADER_LEN as u64 {
        let off = (pos % ring_size as u64) as usize;
        let Ok(h) = FrameHeader::read_from_bytes(&ring[off..off + HEADER_LEN]) else {
            unreachable!("offsets are 16-aligned in a ring of a multiple of 16 bytes");
        };
        let Some((total, verdict)) = validate(&h, pos, off, ring_size, seq, max_payload) else {
            break;
        };
        assert!(total >= HEADER_LEN + TRAILER_LEN && total % FRAME_ALIGN == 0);
        assert!(off + total <= ring_size);
        let seal = &ring[off + total - TRAILER_LEN..off + total];
        if seal != h.seal(seq).to_le_bytes() {
            break;
        }
        let Ok(info) = verdict else {
            break;
        };
        assert_eq!((info.seq, info.total), (seq, total));
        assert!(HEADER_LEN + info.len as usize + TRAILER_LEN <= info.total);
        let payload = &ring[off + HEADER_LEN..off + HEADER_LEN + info.len as usize];
        std::hint::black_box(payload);
        pos += info.total as u64;
        left = left.saturating_sub(info.total as u64);
        seq += 1;
    }
});
