//! Damage to the journal files between a crash and the restart, as a disk that lies would
//! leave them (TigerBeetle's storage fault model, phase A: what can be done to the files
//! from outside the journal code).

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// What was done to the journal, and what the restart must therefore do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// Nothing, or only bytes past the durable point (the start must accept the journal).
    Cuttable,
    /// Bytes inside the durable extent, or the current segment lost while archives exist:
    /// the start must be refused.
    MustRefuse(String),
}

/// Sector size of the damage.
const SECTOR: u64 = 512;

/// Zeroes the sector holding a byte drawn in `[from, to)`, clipped to that range (`false`
/// if those bytes were all zero already: no damage).
pub fn zero_sector(path: &Path, from: u64, to: u64, rng: &mut ChaCha8Rng) -> io::Result<bool> {
    let at = rng.gen_range(from..to);
    let start = (at / SECTOR * SECTOR).max(from);
    let end = ((at / SECTOR + 1) * SECTOR).min(to);
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let mut buf = vec![0u8; (end - start) as usize];
    f.read_exact_at(&mut buf, start)?;
    if buf.iter().all(|b| *b == 0) {
        return Ok(false);
    }
    f.write_all_at(&vec![0u8; buf.len()], start)?;
    Ok(true)
}

/// Flips bits of one byte drawn in `[from, to)`; returns its offset.
pub fn corrupt_byte(path: &Path, from: u64, to: u64, rng: &mut ChaCha8Rng) -> io::Result<u64> {
    let at = rng.gen_range(from..to);
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at)?;
    b[0] ^= rng.gen_range(1..=255u8);
    f.write_all_at(&b, at)?;
    Ok(at)
}

/// Cuts the file to `len` bytes.
pub fn cut(path: &Path, len: u64) -> io::Result<()> {
    OpenOptions::new().write(true).open(path)?.set_len(len)
}

/// The length of the file (0 if it is missing).
pub fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Damages an archived segment `PATH.N`, at one restart in twelve where archives exist, in
/// a way the start must refuse (the archives are checked against the segment after each at
/// open): one cut short (its length is not the length it was sealed at), one missing that
/// is not the oldest (a gap; the oldest may have been pruned by an operator), or two swapped
/// (reordered). Damage inside an archive's records is not drawn: the start does not read
/// them (the current segment's checkpoint holds the day). Returns what was done.
pub fn damage_archive(path: &Path, rng: &mut ChaCha8Rng) -> io::Result<Option<String>> {
    if !rng.gen_bool(1.0 / 12.0) {
        return Ok(None);
    }
    let name = |n: u64| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        std::path::PathBuf::from(p)
    };
    // A rotation whose rename failed leaves the current file linked as `PATH.N` too: that
    // name is not an archive (removing it loses nothing; cutting it cuts the current
    // segment), so it is left out, as the journal leaves it out.
    let inode = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
    };
    let current = inode(path);
    let nums: Vec<u64> = (1..)
        .take_while(|&n| name(n).exists())
        .filter(|&n| current.is_none() || inode(&name(n)) != current)
        .collect();
    let Some(&newest) = nums.last() else {
        return Ok(None);
    };
    let what = match rng.gen_range(0..3) {
        0 => {
            let n = rng.gen_range(1..=newest);
            let l = len(&name(n));
            let to = rng.gen_range(crate::journal::HEADER_LEN..l);
            cut(&name(n), to)?;
            format!("archived segment {n} cut from {l} to {to} bytes")
        }
        1 if newest >= 2 => {
            let n = rng.gen_range(2..=newest);
            std::fs::remove_file(name(n))?;
            format!("archived segment {n} missing (not the oldest)")
        }
        2 if newest >= 2 => {
            let n = rng.gen_range(2..=newest);
            let tmp = name(0);
            std::fs::rename(name(n), &tmp)?;
            std::fs::rename(name(n - 1), name(n))?;
            std::fs::rename(&tmp, name(n - 1))?;
            format!("archived segments {} and {n} swapped", n - 1)
        }
        _ => return Ok(None),
    };
    Ok(Some(what))
}
