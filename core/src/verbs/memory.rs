//! Protection domains and registered memory.

use super::device::Context;
use super::error::Result;
use super::error::{last_err, VerbsError};
use crate::rdma_settings::HugePages;
use rdma_sys as sys;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Size of a huge page (the x86_64 and aarch64 default).
pub const HUGE_PAGE: usize = 2 << 20;
/// Mappings at least this large (rings, staging areas, receive pools) go on
/// huge pages when the policy allows; smaller ones (credit words, activity
/// slots) stay on 4 KiB pages rather than round up to 2 MiB each.
pub const HUGE_PAGE_MIN: usize = 1 << 20;

// The process-wide page policy: 0 off, 1 auto, 2 on. Set once at start-up
// by the service from `[rdma] hugepages`; read at each allocation (set-up
// only, never per message).
static PAGE_POLICY: AtomicU8 = AtomicU8::new(0);
static REGISTERED_BYTES: AtomicU64 = AtomicU64::new(0);
static HUGE_PAGE_BYTES: AtomicU64 = AtomicU64::new(0);
static HUGE_PAGE_FALLBACKS: AtomicU64 = AtomicU64::new(0);
static FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);

/// Sets where this process's registered memory lives from now on (a
/// service calls it once, from `[rdma] hugepages`; the library's own
/// default is [`HugePages::Off`]).
pub fn set_huge_pages(policy: HugePages) {
    let v = match policy {
        HugePages::Off => 0,
        HugePages::Auto => 1,
        HugePages::On => 2,
    };
    // ORDERING: Relaxed: a lone setting read by later allocations of the
    // thread that set it, or of threads it spawned afterwards (spawn orders).
    PAGE_POLICY.store(v, Ordering::Relaxed);
}

/// The page policy [`set_huge_pages`] set.
pub fn huge_pages() -> HugePages {
    // ORDERING: Relaxed, as in set_huge_pages.
    match PAGE_POLICY.load(Ordering::Relaxed) {
        1 => HugePages::Auto,
        2 => HugePages::On,
        _ => HugePages::Off,
    }
}

/// This process's registered memory now, for `rocebus stat` and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegisteredMemory {
    /// Bytes registered with the device (pinned), all regions.
    pub bytes: u64,
    /// Of those, bytes on 2 MiB huge pages.
    pub huge_page_bytes: u64,
    /// Allocations that asked for huge pages and got 4 KiB pages
    /// (`hugepages = "auto"` with no free huge pages).
    pub huge_page_fallbacks: u64,
}

/// This process's registered memory now.
pub fn registered_memory() -> RegisteredMemory {
    // ORDERING: Relaxed: statistics, no data is published through them.
    RegisteredMemory {
        bytes: REGISTERED_BYTES.load(Ordering::Relaxed),
        huge_page_bytes: HUGE_PAGE_BYTES.load(Ordering::Relaxed),
        huge_page_fallbacks: HUGE_PAGE_FALLBACKS.load(Ordering::Relaxed),
    }
}

fn count_registered(bytes: usize, huge: bool, add: bool) {
    let b = bytes as u64;
    // ORDERING: Relaxed: statistics only.
    let apply = |c: &AtomicU64| {
        if add {
            c.fetch_add(b, Ordering::Relaxed)
        } else {
            c.fetch_sub(b, Ordering::Relaxed)
        }
    };
    apply(&REGISTERED_BYTES);
    if huge {
        apply(&HUGE_PAGE_BYTES);
    }
}

/// A protection domain.
pub struct ProtectionDomain {
    pd: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: a PD is an inert handle; verbs taking it are thread-safe.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above, only &self methods.
unsafe impl Sync for ProtectionDomain {}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: valid context.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.as_raw()) };
        let pd = NonNull::new(pd).ok_or_else(|| VerbsError::AllocPd(last_err()))?;
        Ok(Arc::new(Self {
            pd,
            ctx: ctx.clone(),
        }))
    }
    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
    /// The raw PD.
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every object created in this PD holds an Arc to it, so none
        // is left; the PD is deallocated once.
        unsafe { sys::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// Access rights of a memory region. Nothing remote unless asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(u32);

impl Access {
    /// Local read only (send from it).
    pub const LOCAL: Access = Access(0);
    /// The device may write into it locally (receive into it, RDMA READ
    /// responses). Required by verbs with any remote write.
    pub const LOCAL_WRITE: Access = Access(sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// Peers may RDMA WRITE into it (implies LOCAL_WRITE, as verbs requires).
    pub const REMOTE_WRITE: Access = Access(
        sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
    );
    /// Peers may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);

    /// Both sets of rights.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
    /// Whether all of `other`'s rights are included.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

/// Page-aligned anonymous memory registered with the device. The region owns
/// its memory; it is deregistered before it is unmapped.
///
/// The memory may be written by the device (and, with [`Access::REMOTE_WRITE`],
/// by peers) at any time, so it is never handed out as `&[u8]`; copy in and
/// out with [`write_at`](Self::write_at) / [`read_at`](Self::read_at), or use
/// the raw pointer in code that argues its own ordering (the ring module).
///
/// Writing takes `&mut self`: whoever holds the region exclusively may copy
/// into it, and no shared borrow handed out by an owner (a ring, a pool)
/// can be alive meanwhile. Owners keep the region private and hand out
/// `&MemoryRegion` only, through which nothing can be written.
pub struct MemoryRegion {
    mr: NonNull<sys::ibv_mr>,
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
    access: Access,
    pd: Arc<ProtectionDomain>,
    /// The mapping this region registers part of, when it does not own its
    /// memory ([`MemoryRegion::register_shared`]); dropped (and unmapped
    /// by its last owner) after the region is deregistered.
    shared: Option<Arc<SharedMemory>>,
    /// Registered bytes on huge pages (counted in [`registered_memory`]).
    huge: bool,
    /// Registered bytes (counted in [`registered_memory`]).
    registered: usize,
}

/// Page-aligned anonymous memory (zeroed) that several memory regions
/// register parts of, possibly in different protection domains: e.g. one
/// summary array of which each connection's queue pair may write only its
/// own byte. Unmapped when the last region registering it and the last
/// other owner are gone.
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
    huge: bool,
}

// SAFETY: the mapping is owned by this value; every access to its bytes
// goes through the raw pointer by code that argues its own synchronisation
// (atomics: the device may write them at any time).
unsafe impl Send for SharedMemory {}
// SAFETY: as above; &self methods hand out the address only.
unsafe impl Sync for SharedMemory {}

impl fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMemory")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

fn mmap_anon(map_len: usize, extra_flags: i32) -> std::result::Result<NonNull<u8>, std::io::Error> {
    // SAFETY: anonymous private mapping, no file, no fixed address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_err());
    }
    Ok(NonNull::new(p.cast::<u8>()).expect("mmap never returns NULL on success"))
}

/// Maps `len` zeroed bytes: on 2 MiB huge pages when the policy asks for
/// them and `len` is at least [`HUGE_PAGE_MIN`], else on 4 KiB pages.
/// Returns the mapping, its length and whether it is on huge pages.
fn map_anonymous(len: usize) -> Result<(NonNull<u8>, usize, bool)> {
    let policy = huge_pages();
    if policy != HugePages::Off && len >= HUGE_PAGE_MIN {
        let map_len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        match mmap_anon(map_len, libc::MAP_HUGETLB) {
            Ok(p) => return Ok((p, map_len, true)),
            Err(source) if policy == HugePages::On => {
                return Err(VerbsError::HugePages { len, source });
            }
            Err(e) => {
                // ORDERING: Relaxed: statistics and a log-once flag.
                HUGE_PAGE_FALLBACKS.fetch_add(1, Ordering::Relaxed);
                if !FALLBACK_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        bytes = len,
                        error = %e,
                        "hugepages = \"auto\": no free 2 MiB huge pages, so registered memory \
                         falls back to 4 KiB pages (reserve some: sysctl vm.nr_hugepages=N; \
                         logged once, `rocebus stat` counts every fallback)"
                    );
                }
            }
        }
    }
    let page = 4096usize;
    let map_len = len.max(1).div_ceil(page) * page;
    let p = mmap_anon(map_len, 0).map_err(|source| VerbsError::AllocMemory { len, source })?;
    Ok((p, map_len, false))
}

impl SharedMemory {
    /// Maps `len` zeroed bytes (rounded up to whole pages).
    pub fn new(len: usize) -> Result<Arc<Self>> {
        let (ptr, map_len, huge) = map_anonymous(len)?;
        Ok(Arc::new(Self {
            ptr,
            len,
            map_len,
            huge,
        }))
    }
    /// Usable length in bytes (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the mapping is on 2 MiB huge pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }
    /// Whether empty (never: at least one page is mapped).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The first byte; valid (page-aligned, `len()` bytes) while `self`
    /// lives. Whoever reads or writes through it argues its own
    /// synchronisation with the device (atomic access only).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: every region registering part of this mapping holds an Arc
        // to it and deregistered before releasing it; unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

// SAFETY: the region's memory is owned by this value and the MR handle is
// inert; concurrent access to the bytes goes through raw pointers whose
// users argue their own synchronisation.
unsafe impl Send for MemoryRegion {}
// SAFETY: &self methods copy bytes through raw pointers (see type docs).
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

impl MemoryRegion {
    /// Allocates `len` zeroed bytes (rounded up to whole pages) and registers
    /// them with exactly `access`.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> Result<Self> {
        let (ptr, map_len, huge) = map_anonymous(len)?;
        let p = ptr.as_ptr().cast::<libc::c_void>();
        // SAFETY: [ptr, ptr+map_len) is our fresh mapping; the PD is valid.
        let mr = unsafe { sys::ibv_reg_mr(pd.as_raw(), p, map_len, access.0 as i32) };
        let Some(mr) = NonNull::new(mr) else {
            let e = last_err();
            // SAFETY: unmapping the mapping created above, not registered.
            unsafe { libc::munmap(p, map_len) };
            return Err(VerbsError::RegisterMemoryRegion { len, source: e });
        };
        count_registered(map_len, huge, true);
        Ok(Self {
            mr,
            ptr,
            len,
            map_len,
            access,
            pd: pd.clone(),
            shared: None,
            huge,
            registered: map_len,
        })
    }

    /// Registers `len` bytes at `offset` of `mem` (in bounds, else
    /// [`VerbsError::SgeOutOfBounds`]) with exactly `access`: a peer given
    /// this region's rkey reaches those bytes and nothing else of `mem`.
    /// The region keeps `mem` mapped until it is deregistered.
    pub fn register_shared(
        pd: &Arc<ProtectionDomain>,
        mem: &Arc<SharedMemory>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Self> {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > mem.len()) {
            return Err(VerbsError::SgeOutOfBounds {
                offset,
                len,
                region_len: mem.len(),
            });
        }
        // SAFETY: in bounds of the mapping (checked above).
        let p = unsafe { mem.as_ptr().add(offset) };
        // SAFETY: [p, p+len) lies in a live mapping that this region keeps
        // alive (the Arc below) until after ibv_dereg_mr; the PD is valid.
        let mr = unsafe { sys::ibv_reg_mr(pd.as_raw(), p.cast(), len, access.0 as i32) };
        let Some(mr) = NonNull::new(mr) else {
            return Err(VerbsError::RegisterMemoryRegion {
                len,
                source: last_err(),
            });
        };
        count_registered(len, mem.huge, true);
        Ok(Self {
            mr,
            ptr: NonNull::new(p).expect("inside a mapping"),
            len,
            map_len: 0,
            access,
            pd: pd.clone(),
            shared: Some(mem.clone()),
            huge: mem.huge,
            registered: len,
        })
    }

    /// Usable length in bytes (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region is empty (never: at least one page is mapped).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Local key, for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is valid for self's life; lkey is immutable.
        unsafe { self.mr.as_ref().lkey }
    }
    /// Remote key, for peers (meaningful only with remote access).
    pub fn rkey(&self) -> u32 {
        // SAFETY: as lkey.
        unsafe { self.mr.as_ref().rkey }
    }
    /// The registered address (what a peer uses as remote address).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    /// The rights it was registered with.
    pub fn access(&self) -> Access {
        self.access
    }
    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    /// Raw pointer to the first byte; valid for `len()` bytes while `self`
    /// lives. Whoever reads or writes through it must argue that the device
    /// is not concurrently writing the same bytes, or use volatile/atomic
    /// access.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(VerbsError::SgeOutOfBounds {
                offset,
                len,
                region_len: self.len,
            });
        }
        Ok(())
    }

    /// Copies `src` into the region at `offset`. `&mut self`: no shared
    /// borrow of the region can be alive (see the type's docs); what the
    /// device may be reading is the poster's contract (`post_send`).
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: bounds checked; src is a shared borrow that cannot point
        // into this region (no safe API hands one out, and &mut self
        // excludes any other borrow of self).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// Copies bytes out of the region at `offset` (a snapshot: with remote
    /// write access a peer may be changing them meanwhile, so each byte is
    /// read with a volatile load, never through a reference).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: in bounds (checked above) of the mapping, which lives
            // as long as self; u8 has no invalid values.
            *d = unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(offset + i)) };
        }
        Ok(())
    }

    /// Copies the region's bytes at `offset` into a new vector (tests, tools).
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        count_registered(self.registered, self.huge, false);
        // SAFETY: deregister first (the device loses access), then unmap
        // our own mapping, both exactly once; a shared mapping is unmapped
        // by its last owner, after this (the field drops after this body).
        unsafe {
            sys::ibv_dereg_mr(self.mr.as_ptr());
            if self.shared.is_none() {
                libc::munmap(self.ptr.as_ptr().cast(), self.map_len);
            }
        }
    }
}

/// This process's `RLIMIT_MEMLOCK` soft limit in bytes (`None`: unlimited),
/// and whether it holds `CAP_IPC_LOCK`, which lets it pin memory past the
/// limit (root usually does).
pub fn memlock_limit() -> std::io::Result<(Option<u64>, bool)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out pointer to a plain struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Err(last_err());
    }
    let limit = (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur);
    // CapEff in /proc/self/status, bit 14 (CAP_IPC_LOCK).
    let ipc_lock = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 14) != 0);
    Ok((limit, ipc_lock))
}
