//! The C and C++ examples, compiled by `build.rs` with the system's
//! compilers against `include/rocebus.h`, linked here against the shared
//! library cargo built for these tests, then run: on the host under valgrind's memcheck (leaks, invalid reads
//! and writes across the boundary), and in the soft-RoCE guest for the
//! orders path.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder of the library cargo built with these tests: the test's own
/// folder (`target/debug/deps`). Not `target/debug`: `cargo test` builds
/// the cdylib into `deps` and leaves the copy in `target/debug` as the last
/// `cargo build` made it, so linking that one would test a stale library.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().expect("the test's folder").to_path_buf();
    assert!(
        dir.join("librocebus_ffi.so").is_file(),
        "no librocebus_ffi.so in {}",
        dir.display()
    );
    dir
}

/// A command running `program` with none of the library paths `cargo test`
/// exports (they name `target/debug`, whose copy of the library is stale).
fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env_remove("LD_LIBRARY_PATH");
    c
}

/// Links the object `build.rs` compiled from `examples/NAME.*` (warnings
/// are errors there) against the library, into `out`; returns the program.
fn link(name: &str, compiler: &str, out: &Path) -> PathBuf {
    let built = Path::new(env!("OUT_DIR"));
    let err = std::fs::read_to_string(built.join(format!("{name}.err")))
        .expect("build.rs's report on the examples");
    assert!(
        err.is_empty(),
        "build.rs failed to compile examples/{name}:\n{err}"
    );
    let lib = lib_dir();
    let exe = out.join(name);
    let st = Command::new(compiler)
        .arg(built.join(format!("{name}.o")))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        // DT_RPATH (not RUNPATH): it wins over LD_LIBRARY_PATH, which
        // `cargo test` sets to folders holding stale copies of the library.
        .arg(format!("-Wl,-rpath,{},--disable-new-dtags", lib.display()))
        .args(["-lrocebus_ffi", "-lpthread"])
        .status()
        .unwrap_or_else(|e| panic!("running {compiler} (the system compiler) to link: {e}"));
    assert!(st.success(), "{compiler} failed to link examples/{name}");
    exe
}

/// Runs `exe ARGS` under valgrind's memcheck (any error or leak fails it)
/// and checks its output has `expect`.
fn memcheck(exe: &Path, args: &[&std::ffi::OsStr], expect: &str) {
    let out = command("valgrind")
        .args([
            "--leak-check=full",
            "--error-exitcode=1",
            "--errors-for-leak-kinds=definite,possible",
            "--quiet",
        ])
        .arg(exe)
        .args(args)
        .output()
        .expect("running valgrind (apt-get install valgrind)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(expect),
        "{} under valgrind: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        exe.display(),
        out.status
    );
}

#[test]
fn c_ipc_pingpong_under_valgrind() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = link("ipc_pingpong", "cc", tmp.path());
    let streams = tmp.path().join("streams");
    memcheck(
        &exe,
        &[streams.as_os_str(), "200".as_ref()],
        "ipc_pingpong: 200 round trips ok",
    );
}

/// The static library works as well: the same example linked against
/// `librocebus_ffi.a` (and what it needs from the system: libibverbs,
/// librdmacm, libpthread, libdl, libm).
#[test]
fn c_ipc_pingpong_static_library() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let built = Path::new(env!("OUT_DIR"));
    let exe = tmp.path().join("ipc_pingpong_static");
    let st = Command::new("cc")
        .arg(built.join("ipc_pingpong.o"))
        .arg("-o")
        .arg(&exe)
        .arg(lib_dir().join("librocebus_ffi.a"))
        .args(["-libverbs", "-lrdmacm", "-lpthread", "-ldl", "-lm"])
        .status()
        .expect("running cc");
    assert!(
        st.success(),
        "cc failed to link ipc_pingpong.o with librocebus_ffi.a"
    );
    let out = command(&exe)
        .arg(tmp.path().join("streams"))
        .arg("500")
        .output()
        .expect("running ipc_pingpong_static");
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("ipc_pingpong: 500 round trips ok"),
        "ipc_pingpong (static): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn cpp_ipc_wrapper_under_valgrind() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = link("ipc_cpp", "c++", tmp.path());
    let streams = tmp.path().join("streams");
    memcheck(&exe, &[streams.as_os_str()], "ipc_cpp: ok");
}

/// The address of this host's RDMA device (in the guest: the runner's
/// `ROCEBUS_GUEST_ADDR`).
fn local_ip() -> std::net::IpAddr {
    if let Some(a) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return a;
    }
    let ctx = rocebus::verbs::Context::open(None).expect("an RDMA device");
    let i = ctx.default_gid_index(1).expect("a GID");
    std::net::IpAddr::V4(
        ctx.query_gid(1, i)
            .expect("GID")
            .ipv4()
            .expect("an IPv4 GID"),
    )
}

/// Links example `name` with `compiler` and runs it against an orders
/// listener on this host's RDMA device at `port`, for `rounds` round trips.
fn orders_example(name: &str, compiler: &str, port: u16, rounds: u32) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = std::time::Instant::now();
    let exe = link(name, compiler, tmp.path());
    eprintln!("linked {name} in {:.1} s", t.elapsed().as_secs_f64());
    let addr = std::net::SocketAddr::new(local_ip(), port);
    let t = std::time::Instant::now();
    let out = command(&exe)
        .arg(addr.to_string())
        .arg(rounds.to_string())
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{name} ran in {:.1} s", t.elapsed().as_secs_f64());
    assert!(
        out.status.success() && stdout.contains(&format!("{name}: {rounds} round trips ok")),
        "{name}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_c_orders_echo() {
    orders_example("orders_echo", "cc", 7561, 300);
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_cpp_orders_echo() {
    orders_example("orders_cpp", "c++", 7562, 200);
}
