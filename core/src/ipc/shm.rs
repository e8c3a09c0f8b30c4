//! The shared mapping of an IPC stream file and the only unsafe code of the
//! IPC transport: atomic words and byte ranges at offsets of a region that
//! other processes map too.
//!
//! Memory shared with another process is outside what the Rust compiler
//! can see: another process may write any byte at any time. So nothing
//! here hands out a reference to bytes another process may write while we
//! hold it, except where the protocol (documented in [`super`]) gives the
//! holder exclusive use of them: the publisher's claimed, not yet committed
//! frame, and a committed frame a subscriber reads in the mode where the
//! publisher waits for it. A misbehaving process can still write there; the
//! bytes are plain data (no invariants, no pointers), so it garbles
//! messages, never memory safety of ours beyond what `&[u8]` of
//! peer-writable memory means (documented on [`super::Message`]).
//!
//! A subscriber maps the file twice: the header and slot pages read-write
//! (it writes its own slot there), the ring read-only, so a subscriber's
//! bug cannot write into the frames. The header shares its page with the
//! slots (a layout change would be a new version), so it stays writable to
//! subscribers; only the owner's processes can open the file at all.
#![allow(unsafe_code)]

use memmap2::{Mmap, MmapMut, MmapOptions};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

/// A mapped stream file.
#[derive(Debug)]
pub(super) struct Shm {
    /// The whole file (publisher), or its header and slot pages (subscriber).
    map: MmapMut,
    /// A subscriber's read-only mapping of the ring, and the file offset it
    /// starts at.
    ring: Option<(Mmap, usize)>,
    len: usize,
}

impl Shm {
    /// Maps `file` (its whole length) shared, read-write.
    pub(super) fn map(file: &File) -> std::io::Result<Self> {
        // SAFETY: the mapping is MAP_SHARED of a file other processes map
        // too; we never create references into it except as described in
        // the module docs, and all control words are accessed atomically.
        // Its length was checked with fstat by the caller; only processes of
        // the file's owner can shrink it (mode 0600 in a 0700 directory),
        // and the publisher grows it back when it finds it truncated.
        let map = unsafe { MmapMut::map_mut(file)? };
        let len = map.len();
        Ok(Shm {
            map,
            ring: None,
            len,
        })
    }

    /// Maps `file` of `len` bytes as a subscriber: `0..ctl` read-write
    /// (`ctl` a multiple of the page size), `ctl..len` read-only.
    pub(super) fn map_split(file: &File, ctl: usize, len: usize) -> std::io::Result<Self> {
        // SAFETY: as in `map`; both mappings are MAP_SHARED of the same
        // file, the caller checked with fstat that it holds `len` bytes.
        let map = unsafe { MmapOptions::new().len(ctl).map_mut(file)? };
        // SAFETY: as above; a read-only view of the rest of the file.
        let ring = unsafe {
            MmapOptions::new()
                .offset(ctl as u64)
                .len(len - ctl)
                .map(file)?
        };
        Ok(Shm {
            map,
            ring: Some((ring, ctl)),
            len,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Where offset `off` of the file is: in the read-write mapping, or
    /// (subscriber, `off` in the ring) in the read-only one.
    #[inline(always)]
    fn base_for(&self, off: usize) -> *mut u8 {
        match &self.ring {
            Some((ring, start)) if off >= *start => {
                // wrapping_sub: an address computation only; every pointer
                // made from it adds `off >= start` back before it is used.
                ring.as_ptr().wrapping_sub(*start) as *mut u8
            }
            _ => self.map.as_ptr() as *mut u8,
        }
    }

    /// The 8-byte aligned atomic word at `off`.
    #[inline(always)]
    pub(super) fn word(&self, off: usize) -> &AtomicU64 {
        assert!(
            off % 8 == 0 && off + 8 <= self.len(),
            "word {off} outside the mapping"
        );
        // SAFETY: in bounds and 8-aligned (the mappings are page-aligned and
        // the split is at a page); AtomicU64 has the layout of u64 and every
        // access to control words and frame headers, in every process, is
        // atomic. Words of a read-only mapping are only loaded.
        unsafe { &*(self.base_for(off).wrapping_add(off) as *const AtomicU64) }
    }

    /// The word at `off` without the bounds check: for the hot path, where
    /// `off` comes from `pos & mask` of a ring whose bounds were checked at
    /// open.
    #[inline(always)]
    pub(super) fn word_unchecked(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len());
        // SAFETY: callers pass an offset inside the data ring, checked
        // against the mapping's length when it was opened, 8-aligned. A
        // subscriber only loads ring words (its ring mapping is read-only).
        unsafe { &*(self.base_for(off).wrapping_add(off) as *const AtomicU64) }
    }

    /// Bytes `off..off + len` for the publisher to fill.
    ///
    /// # Safety
    /// The range must be inside the mapping and owned by the caller under
    /// the protocol: a claimed frame no subscriber reads before its header
    /// is published, and no other `slice`/`slice_mut` of it lives.
    #[inline(always)]
    // Shared memory: exclusivity comes from the protocol (see # Safety),
    // not from the borrow of the mapping.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn slice_mut(&self, off: usize, len: usize) -> &mut [u8] {
        debug_assert!(off + len <= self.len());
        debug_assert!(self.ring.is_none(), "the publisher's mapping is read-write");
        // SAFETY: per this function's contract; the publisher maps the
        // whole file read-write.
        unsafe { std::slice::from_raw_parts_mut(self.base_for(off).wrapping_add(off), len) }
    }

    /// Bytes `off..off + len` of a published frame.
    ///
    /// # Safety
    /// The range must be inside the mapping and, under the protocol, not be
    /// written by the publisher while the slice lives (a committed frame the
    /// publisher waits for this subscriber to consume).
    #[inline(always)]
    pub(super) unsafe fn slice(&self, off: usize, len: usize) -> &[u8] {
        debug_assert!(off + len <= self.len());
        // SAFETY: per this function's contract.
        unsafe { std::slice::from_raw_parts(self.base_for(off).wrapping_add(off), len) }
    }

    /// Copies bytes `off..off + out.len()` (8-aligned `off`) into `out`
    /// with relaxed atomic loads: for frames the publisher may overwrite
    /// while we read them (the mode that drops slow subscribers). The copy
    /// is validated afterwards by the caller.
    pub(super) fn copy_racy(&self, off: usize, out: &mut [u8]) {
        assert!(off % 8 == 0 && off + out.len().next_multiple_of(8) <= self.len());
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            let w = self.word_unchecked(off + i * 8).load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_le_bytes()[..chunk.len()]);
        }
    }

    /// Writes `bytes` at `off` (header fields written once, before the
    /// file is published).
    pub(super) fn write_init(&mut self, off: usize, bytes: &[u8]) {
        self.map[off..off + bytes.len()].copy_from_slice(bytes);
    }
}
