//! `tag-cost`: what one per-datagram tag costs on this CPU (host or guest), with no
//! RDMA involved. Times `rocebus::auth::DatagramKey::tag` and `verify` (SipHash-2-4, the
//! real code the market-data publisher and subscriber call) over datagram sizes typical of
//! the md path, and beside them the keyed BLAKE3 tag the datagram tag used before
//! (`auth::Key::tag`, still the handshakes' MAC) so one run shows what the change bought.
//!
//! Absolute figures: in an emulated guest they vary run to run; compare lines of one run.

use rocebus::auth::{DatagramKey, Key, Purpose};
use std::hint::black_box;
use std::time::Instant;

/// Options of `tag-cost`.
#[derive(Debug, Clone, clap::Args)]
pub struct TagCostArgs {
    /// Calls timed per operation and size.
    #[arg(short = 'n', long, default_value_t = 200_000)]
    pub iterations: u32,
    /// Datagram sizes in bytes, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "64,128,512,1400")]
    pub sizes: Vec<usize>,
}

/// Nanoseconds per call of `f`, over `n` calls (after `n / 10` warm-up calls).
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n.max(1))
}

/// Runs the measurement and prints one line per size, then a `RESULT` line.
pub fn run(a: &TagCostArgs) -> anyhow::Result<()> {
    #[cfg(target_arch = "x86_64")]
    println!(
        "cpu: sse2={} sse4.1={} avx2={} avx512f={} avx512vl={}",
        std::arch::is_x86_feature_detected!("sse2"),
        std::arch::is_x86_feature_detected!("sse4.1"),
        std::arch::is_x86_feature_detected!("avx2"),
        std::arch::is_x86_feature_detected!("avx512f"),
        std::arch::is_x86_feature_detected!("avx512vl"),
    );
    let key = DatagramKey::derive(b"tag-cost secret");
    let blake = Key::derive(b"tag-cost secret", Purpose::Recovery);
    let n = a.iterations;
    println!(
        "{:>6} {:>10} {:>10} {:>12} {:>12}  (ns per call, {n} calls each)",
        "bytes", "tag", "verify", "blake3 tag", "blake3 verify"
    );
    let mut result = String::from("RESULT");
    for &size in &a.sizes {
        let body: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let tag = key.tag(&body);
        let t_tag = per_call(n, || {
            black_box(key.tag(black_box(&body[..])));
        });
        let t_verify = per_call(n, || {
            assert!(black_box(key.verify(black_box(&body[..]), &tag)));
        });
        let btag = blake.tag(&[&body]);
        let t_btag = per_call(n, || {
            black_box(blake.tag(&[black_box(&body[..])]));
        });
        let t_bverify = per_call(n, || {
            assert!(black_box(blake.verify(&[black_box(&body[..])], &btag)));
        });
        println!("{size:>6} {t_tag:>10.1} {t_verify:>10.1} {t_btag:>12.1} {t_bverify:>12.1}");
        result.push_str(&format!(
            " tag_ns_{size}={t_tag:.1} verify_ns_{size}={t_verify:.1} blake3_tag_ns_{size}={t_btag:.1} blake3_verify_ns_{size}={t_bverify:.1}"
        ));
    }
    rocebus_bench::report::emit_result(&result);
    Ok(())
}
