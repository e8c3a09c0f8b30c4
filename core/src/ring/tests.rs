//! The ring protocol driven over [`LoopbackMemory`]: the shipped
//! [`Sender`] and [`Receiver`], with the RDMA WRITEs replaced by copies
//! that place bytes one at a time in ascending order. `cargo xtask test`
//! also runs these under valgrind's memcheck (filter `ring::tests`), and
//! the `loom` module under `--cfg loom`.

use super::proto::{control_word, Receiver, Sender, StagingMemory, CREDIT_OFF};
use super::{ClaimRefused, LoopbackMemory};

/// The shell's flush over loopback memory: each range of staging written
/// to the same offset of the peer's ring, in order.
fn flush<S: StagingMemory>(tx: &mut Sender<S>, ring: &LoopbackMemory, whole_words: bool) {
    let (ranges, n) = tx.take_flush();
    for &(off, len) in &ranges[..n] {
        let bytes = tx.staging().bytes(off, len);
        if whole_words {
            ring.write_words(off, bytes);
        } else {
            ring.write(off, bytes);
        }
    }
}

/// The shell's credit write: the control word into the sender's memory.
fn send_credit(back: &LoopbackMemory, consumed: u64, whole_words: bool) {
    let at = super::proto::RingMemory::data_len(back) + CREDIT_OFF;
    if whole_words {
        back.write_words(at, &control_word(consumed));
    } else {
        back.write(at, &control_word(consumed));
    }
}

fn staging(size: usize) -> Box<[u8]> {
    vec![0u8; size].into_boxed_slice()
}

#[cfg(not(loom))]
mod host {
    use super::*;
    use crate::ring::frame::{frame_len, FrameHeader, HEADER_LEN, TRAILER_LEN};
    use crate::ring::FrameError;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use zerocopy::IntoBytes;

    /// The payload of frame `i`: its length and bytes follow from `i`, so
    /// the receiver can check every byte it was handed.
    fn payload(i: u64, max: usize, buf: &mut [u8]) -> usize {
        let mut r = SmallRng::seed_from_u64(i);
        let len = match i % 7 {
            0 => 0,
            1 => max,
            _ => r.gen_range(0..=max),
        };
        r.fill(&mut buf[..len]);
        len
    }

    /// Two threads, a small ring, random sizes: thousands of wraps, back
    /// pressure, torn placement racing the receiver; every byte checked.
    #[test]
    fn two_threads_random_sizes_wrap_and_back_pressure() {
        const SIZE: usize = 4096;
        const MAX: usize = 300;
        const FRAMES: u64 = 20_000;
        let ring = LoopbackMemory::new(SIZE);
        let back = LoopbackMemory::new(16);
        let (ring2, back2) = (ring.clone(), back.clone());
        let sender = std::thread::spawn(move || {
            let mut tx = Sender::new(staging(SIZE), MAX);
            let mut buf = vec![0u8; MAX];
            let mut pressured = 0u64;
            let mut one_step = 0u64;
            let mut batch = SmallRng::seed_from_u64(99);
            for i in 0..FRAMES {
                let len = payload(i, MAX, &mut buf);
                loop {
                    // A third of the frames try the shell's one-step
                    // offer-and-flush first (half of them with a limit on
                    // the write's size); it declines whenever `offer` and a
                    // flush of several runs would be needed.
                    if batch.gen_ratio(1, 3) {
                        flush(&mut tx, &ring2, false);
                        let max = if i % 2 == 0 { usize::MAX } else { 160 };
                        tx.set_max_write(max);
                        let before = tx.state().next_seq();
                        if let Some((off, n)) = tx.offer_run(3, 5, &buf[..len]) {
                            assert!(n <= max && tx.state().unflushed() == 0);
                            assert_eq!(tx.state().next_seq(), before + 1);
                            ring2.write(off, tx.staging().bytes(off, n));
                            one_step += 1;
                            break;
                        }
                        assert_eq!(tx.state().next_seq(), before, "declined, nothing done");
                    }
                    match tx.offer(3, 5, &buf[..len], &back2) {
                        Ok(seq) => {
                            assert!(seq > i);
                            break;
                        }
                        Err(ClaimRefused::BackPressured) => {
                            pressured += 1;
                            flush(&mut tx, &ring2, false);
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                    // Never more in flight than the ring holds.
                    assert!(tx.state().in_flight() <= SIZE as u64);
                }
                if batch.gen_ratio(1, 4) {
                    flush(&mut tx, &ring2, false);
                }
            }
            flush(&mut tx, &ring2, false);
            assert!(one_step > FRAMES / 10, "one-step offers: {one_step}");
            (pressured, tx.state().tail())
        });
        let mut rx = Receiver::new(SIZE, MAX, SIZE / 4);
        let mut scratch = vec![0u8; MAX.next_multiple_of(8)];
        let mut want = vec![0u8; MAX];
        let mut got = 0u64;
        while got < FRAMES {
            let mut delivered = 0;
            while let Some(info) = rx.poll(&ring, &mut scratch).expect("no violation") {
                let len = payload(got, MAX, &mut want);
                assert_eq!(info.len as usize, len, "frame {got}");
                assert_eq!((info.stream_id, info.msg_type), (3, 5));
                assert_eq!(&scratch[..len], &want[..len], "frame {got}");
                got += 1;
                delivered += 1;
            }
            if let Some(c) = rx.take_credit(delivered) {
                send_credit(&back, c, false);
            }
            if delivered == 0 {
                std::thread::yield_now();
            }
        }
        let (pressured, tail) = sender.join().unwrap();
        assert_eq!(rx.violations(), 0);
        assert_eq!(rx.state().consumed(), tail);
        assert!(
            tail > 100 * SIZE as u64,
            "wrapped {} times",
            tail / SIZE as u64
        );
        // With a ring this small the sender outruns the receiver at times;
        // not asserted (scheduling decides), only reported.
        eprintln!(
            "back-pressured {pressured} times, {} laps",
            tail / SIZE as u64
        );
    }

    /// Without credit the sender stops at exactly one ring of frames, and
    /// one credit lets it go on; nothing unconsumed is overwritten.
    #[test]
    fn credits_bound_the_sender() {
        const SIZE: usize = 1024;
        let ring = LoopbackMemory::new(SIZE);
        let back = LoopbackMemory::new(16);
        let mut tx = Sender::new(staging(SIZE), 200);
        let mut rx = Receiver::new(SIZE, 200, 256);
        let mut scratch = vec![0u8; 200];
        let mut n = 0u8;
        while tx.offer(1, 1, &[n; 100], &back).is_ok() {
            n += 1;
        }
        // 128-byte frames: 8 fill the ring.
        assert_eq!((n, tx.state().in_flight()), (8, SIZE as u64));
        assert_eq!(
            tx.offer(1, 1, &[0; 1], &back),
            Err(ClaimRefused::BackPressured)
        );
        flush(&mut tx, &ring, false);
        for i in 0..8u8 {
            let f = rx.poll(&ring, &mut scratch).unwrap().unwrap();
            assert_eq!(&scratch[..f.len as usize], &[i; 100]);
        }
        assert_eq!(rx.poll(&ring, &mut scratch), Ok(None));
        // Consumed, but until the credit arrives the sender is still full.
        assert_eq!(
            tx.offer(1, 1, &[0; 1], &back),
            Err(ClaimRefused::BackPressured)
        );
        let c = rx.take_credit(8).expect("a quarter ring consumed");
        // A torn credit (value placed, complement not yet) is not taken.
        back.write(16, &control_word(c)[..12]);
        assert_eq!(
            tx.offer(1, 1, &[0; 1], &back),
            Err(ClaimRefused::BackPressured)
        );
        send_credit(&back, c, false);
        assert!(tx.offer(1, 1, &[42; 1], &back).is_ok());
        flush(&mut tx, &ring, false);
        let f = rx.poll(&ring, &mut scratch).unwrap().unwrap();
        assert_eq!((f.seq, &scratch[..1]), (9, &[42u8][..]));
        assert_eq!(
            tx.offer(1, 0xFF00, &[], &back),
            Err(ClaimRefused::ReservedType)
        );
        assert_eq!(
            tx.offer(1, 1, &[0; 201], &back),
            Err(ClaimRefused::TooLarge)
        );
    }

    /// A credit word the receiver never earned is refused, counted once per
    /// value and changes nothing: one behind the credit taken is only
    /// counted; one beyond what was ever sent is a violation the shell
    /// closes the connection on. The sender never overwrites a frame the
    /// receiver has not consumed, whatever the word says.
    #[test]
    fn forged_credits_are_refused_counted_and_one_beyond_what_was_sent_is_a_violation() {
        use crate::ring::BadCredit;
        const SIZE: usize = 1024;
        let ring = LoopbackMemory::new(SIZE);
        let back = LoopbackMemory::new(16);
        let mut tx = Sender::new(staging(SIZE), 200);
        let mut rx = Receiver::new(SIZE, 200, 256);
        let mut scratch = vec![0u8; 200];
        while tx.offer(1, 1, &[7; 100], &back).is_ok() {}
        flush(&mut tx, &ring, false);
        for _ in 0..4 {
            rx.poll(&ring, &mut scratch).unwrap().unwrap();
        }
        let c = rx.take_credit(4).expect("half the ring consumed");
        send_credit(&back, c, false);
        assert!(tx.offer(1, 1, &[1; 100], &back).is_ok());
        assert_eq!((tx.bad_credits(), tx.credit_violation()), (0, None));
        // Fill what the honest credit allows.
        while tx.offer(1, 1, &[2; 100], &back).is_ok() {}
        flush(&mut tx, &ring, false);
        let flushed = tx.state().flushed();
        assert_eq!(tx.state().in_flight(), SIZE as u64);

        // Behind the credit taken: refused, counted once however often read.
        send_credit(&back, c - 128, false);
        for _ in 0..3 {
            assert_eq!(
                tx.offer(1, 1, &[0; 1], &back),
                Err(ClaimRefused::BackPressured)
            );
        }
        assert_eq!(tx.bad_credits(), 1);
        assert_eq!(
            tx.last_bad_credit(),
            Some(BadCredit::Behind {
                credit: c,
                got: c - 128
            })
        );
        assert_eq!(tx.credit_violation(), None);
        assert_eq!(tx.state().credit(), c);

        // Beyond what was sent (the ring's whole lap ahead, a huge value,
        // the complement-matching all-ones): each refused, counted, and the
        // first is the violation.
        for (i, forged) in [flushed + SIZE as u64, u64::MAX / 2, u64::MAX]
            .into_iter()
            .enumerate()
        {
            send_credit(&back, forged, true);
            assert_eq!(
                tx.offer(1, 1, &[0; 1], &back),
                Err(ClaimRefused::BackPressured)
            );
            assert_eq!(tx.bad_credits(), 2 + i as u64);
        }
        assert_eq!(
            tx.credit_violation(),
            Some(BadCredit::BeyondSent {
                flushed,
                got: flushed + SIZE as u64
            })
        );
        // Nothing unconsumed was overwritten: the receiver still takes the
        // frames it had not consumed, intact.
        assert_eq!(
            (tx.state().credit(), tx.state().in_flight()),
            (c, SIZE as u64)
        );
        let f = rx.poll(&ring, &mut scratch).unwrap().unwrap();
        assert_eq!(&scratch[..f.len as usize], &[7; 100]);
    }

    /// `offer_run` takes exactly the payloads whose frame fits the largest
    /// write and the maximum payload, whatever the limit, and nothing when
    /// no frame fits.
    #[test]
    fn one_step_offers_follow_the_largest_write() {
        use crate::ring::frame::frame_len;
        const SIZE: usize = 4096;
        const MAX: usize = 200;
        for max_write in [
            0,
            16,
            31,
            32,
            33,
            47,
            48,
            100,
            224,
            225,
            240,
            1000,
            usize::MAX,
        ] {
            for len in [0, 1, 7, 8, 9, 24, 25, 72, 184, 199, 200, 201] {
                let mut tx = Sender::new(staging(SIZE), MAX);
                tx.set_max_write(max_write);
                let took = tx.offer_run(1, 1, &[7; 201][..len]);
                let fits = len <= MAX && frame_len(len) <= max_write;
                assert_eq!(took.is_some(), fits, "max_write {max_write} len {len}");
                if let Some((off, n)) = took {
                    assert_eq!((off, n), (0, frame_len(len)));
                }
            }
        }
    }

    /// Every prefix of a frame's placement (bytes in ascending order, the
    /// last one the seal's) is not a frame; the whole is.
    #[test]
    fn a_frame_is_delivered_only_once_sealed() {
        const SIZE: usize = 256;
        let mut tx = Sender::new(staging(SIZE), 40);
        let back = LoopbackMemory::new(16);
        tx.offer(2, 9, &[7; 37], &back).unwrap();
        let (r, n) = tx.take_flush();
        assert_eq!((n, r[0]), (1, (0, 64)));
        let frame = tx.staging().bytes(0, 64).to_vec();
        let mut scratch = [0u8; 40];
        for k in 0..64 {
            let ring = LoopbackMemory::new(SIZE);
            ring.write(0, &frame[..k]);
            let mut rx = Receiver::new(SIZE, 40, 64);
            assert_eq!(rx.poll(&ring, &mut scratch), Ok(None), "prefix {k}");
            ring.write(k, &frame[k..]);
            let f = rx.poll(&ring, &mut scratch).unwrap().unwrap();
            assert_eq!((f.len, &scratch[..37]), (37, &[7u8; 37][..]));
        }
    }

    /// Junk in the ring: bytes that are not the expected header are not a
    /// frame; a header forged with the right check but an impossible
    /// length or type is refused, counted, and never followed (the
    /// loopback memory panics on any load outside the region).
    #[test]
    fn junk_is_refused_and_never_followed() {
        const SIZE: usize = 1024;
        let mut rng = SmallRng::seed_from_u64(7);
        let mut scratch = vec![0u8; 512];
        for round in 0..2_000u64 {
            // Genuine frames first, so the receiver sits at a random offset
            // (near the ring's end as often as not).
            let ring = LoopbackMemory::new(SIZE);
            let back = LoopbackMemory::new(16);
            let mut tx = Sender::new(staging(SIZE), 200);
            let mut rx = Receiver::new(SIZE, 512, 256);
            for _ in 0..rng.gen_range(0..8) {
                let len = rng.gen_range(0..=200);
                tx.offer(1, 1, &vec![1; len], &back).unwrap();
                flush(&mut tx, &ring, false);
                assert!(rx.poll(&ring, &mut scratch).unwrap().is_some());
                if let Some(c) = rx.take_credit(1) {
                    send_credit(&back, c, false);
                }
            }
            let off = rx.state().offset();
            // Junk over everything after it: not a frame.
            let mut junk = vec![0u8; SIZE - off];
            rng.fill(&mut junk[..]);
            ring.write(off, &junk);
            assert_eq!(rx.poll(&ring, &mut scratch), Ok(None), "round {round}");
            // A header forged for the expected sequence, any length or
            // type, sealed where its length puts the seal when that lies
            // in the ring.
            let len: u32 = match round % 3 {
                0 => rng.gen(),
                1 => rng.gen_range(0..1100),
                _ => (SIZE - off - HEADER_LEN - TRAILER_LEN) as u32,
            };
            let ty: u16 = if round % 2 == 0 { 0xFFFF } else { rng.gen() };
            let seq = rx.state().expected_seq();
            let sealed = forge(&ring, off, len, ty, seq);
            match rx.poll(&ring, &mut scratch) {
                // Not sealed (no room for it), or padding to the end then junk.
                Ok(None) => {}
                Ok(Some(f)) => assert!(sealed && f.len as usize <= 512),
                Err(_) => {
                    assert!(sealed);
                    assert_eq!(rx.violations(), 1);
                    // Stuck on the bad frame: the same answer, counted.
                    assert!(rx.poll(&ring, &mut scratch).is_err());
                    assert_eq!(rx.violations(), 2);
                }
            }
        }
        // The cases a hostile peer picks on purpose.
        let ring = LoopbackMemory::new(SIZE);
        let mut rx = Receiver::new(SIZE, 512, 256);
        // A length past the ring's end cannot be sealed: no frame, nothing
        // read past the ring, nothing counted (the peer stalls itself).
        assert!(!forge(&ring, 0, u32::MAX, 1, 1));
        assert_eq!(rx.poll(&ring, &mut scratch), Ok(None));
        assert!(!forge(&ring, 0, SIZE as u32, 1, 1));
        assert_eq!(rx.poll(&ring, &mut scratch), Ok(None));
        assert_eq!(rx.violations(), 0);
        assert!(forge(&ring, 0, 1000, 1, 1));
        assert!(matches!(
            rx.poll(&ring, &mut scratch),
            Err(FrameError::BadLength { len: 1000, .. })
        ));
        assert!(forge(&ring, 0, 0, 0xFF01, 1));
        assert!(matches!(
            rx.poll(&ring, &mut scratch),
            Err(FrameError::BadType { .. })
        ));
        // Padding that does not reach the ring's end.
        assert!(forge(&ring, 0, 16, 0xFFFF, 1));
        assert!(matches!(
            rx.poll(&ring, &mut scratch),
            Err(FrameError::BadType { .. })
        ));
        assert_eq!(rx.violations(), 3);
        // A frame of a later sequence (a peer skipping ahead), and a header
        // changed after its frame was sealed, are not frames.
        let mut rx = Receiver::new(SIZE, 512, 256);
        let ring = LoopbackMemory::new(SIZE);
        assert!(forge(&ring, 0, 8, 1, 2));
        assert_eq!(rx.poll(&ring, &mut scratch), Ok(None));
        assert!(forge(&ring, 0, 8, 1, 1));
        ring.write(0, FrameHeader::new(9, 1, 1).as_bytes());
        assert_eq!(rx.poll(&ring, &mut scratch), Ok(None));
        ring.write(0, FrameHeader::new(8, 1, 1).as_bytes());
        assert_eq!(rx.poll(&ring, &mut scratch).unwrap().unwrap().len, 8);
        assert_eq!(rx.violations(), 0);
    }

    /// Writes a header of `len`, `ty` at `off` and, if a frame of that
    /// length fits before the ring's end, the seal of frame `seq` where the
    /// length puts it; returns whether it did.
    fn forge(ring: &LoopbackMemory, off: usize, len: u32, ty: u16, seq: u64) -> bool {
        let h = FrameHeader::new(len, 1, ty);
        ring.write(off, h.as_bytes());
        let total = frame_len(len as usize);
        let fits = total <= crate::ring::proto::RingMemory::data_len(ring) - off;
        if fits {
            ring.write(off + total - TRAILER_LEN, &h.seal(seq).to_le_bytes());
        }
        fits
    }
}

/// The control words under loom: a sender publishing frames (header, then
/// payload, then seal, one store per word in ascending order) into a ring
/// that holds four, and the receiver returning credit (value, then
/// complement) that the sender needs for the fifth. Every interleaving
/// (to a preemption bound) must deliver the five payloads in order, intact.
/// It can fail: with the loopback's stores made `Relaxed` instead of
/// `Release`, loom finds a run where the seal is seen before the payload
/// (about 40 s for the passing model in a debug build, 6 s to the failure).
///
/// `RUSTFLAGS="--cfg loom" cargo test -p rocebus --lib loom`
#[cfg(loom)]
mod loom_model {
    use super::*;

    #[test]
    fn loom_frames_and_credits() {
        const SIZE: usize = 128;
        const FRAMES: u8 = 5;
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.check(|| {
            let ring = LoopbackMemory::new(SIZE);
            let back = LoopbackMemory::new(16);
            let (ring2, back2) = (ring.clone(), back.clone());
            let sender = loom::thread::spawn(move || {
                let mut tx = Sender::new(staging(SIZE), 8);
                for i in 0..FRAMES {
                    loop {
                        match tx.offer(1, 1, &[i; 8], &back2) {
                            Ok(_) => break,
                            Err(ClaimRefused::BackPressured) => {
                                flush(&mut tx, &ring2, true);
                                loom::thread::yield_now();
                            }
                            Err(e) => panic!("{e:?}"),
                        }
                        assert!(tx.state().in_flight() <= SIZE as u64);
                    }
                }
                flush(&mut tx, &ring2, true);
            });
            let mut rx = Receiver::new(SIZE, 8, 32);
            let mut scratch = [0u8; 8];
            let mut got = 0u8;
            while got < FRAMES {
                let f = rx.poll(&ring, &mut scratch).expect("no violation");
                let delivered = match f {
                    Some(f) => {
                        assert_eq!((f.seq, scratch), (got as u64 + 1, [got; 8]));
                        got += 1;
                        1
                    }
                    None => 0,
                };
                if let Some(c) = rx.take_credit(delivered) {
                    send_credit(&back, c, true);
                }
                if delivered == 0 {
                    loom::thread::yield_now();
                }
            }
            sender.join().unwrap();
        });
    }
}
