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

/// A process this test started, killed (by its own handle) when the test ends, whatever
/// way it ends.
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The last lines of a log file, for a failure's message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let skip = text.lines().count().saturating_sub(20);
    let last: Vec<&str> = text.lines().skip(skip).collect();
    format!("--- {}:\n{}", path.display(), last.join("\n"))
}

/// The C++ engine example (`examples/engine_cpp.cpp`, through `rocebus.hpp`) against the
/// real feed handler and order gateway, as the demo pipeline runs them (its configs, with
/// this host's address and a scratch folder): market data from the bus, orders through the
/// gateway to its venue simulator, every one acknowledged and filled.
#[test]
#[ignore = "rdma: runs feed-handler and order-gateway on an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_cpp_engine_against_feed_handler_and_gateway() {
    let bin = lib_dir().parent().expect("target/debug").to_path_buf();
    for b in ["feed-handler", "order-gateway"] {
        assert!(
            bin.join(b).is_file(),
            "{} missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
            bin.join(b).display()
        );
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = tmp.path();
    let addr = local_ip().to_string();
    let configs = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("ffi is inside the workspace")
        .join("configs/demo");
    for f in ["feed-handler", "sample-engine", "order-gateway"] {
        let text = std::fs::read_to_string(configs.join(format!("{f}.toml"))).unwrap();
        let text = text
            .replace("198.18.0.1", &addr)
            .replace("/tmp/rocebus-demo", &work.display().to_string());
        std::fs::write(work.join(format!("{f}.toml")), text).unwrap();
    }
    std::fs::create_dir_all(work.join("counters")).unwrap();
    let day = work.join("day.itch50");
    let st = command(bin.join("feed-handler"))
        .args([
            "generate",
            "--seed",
            "1",
            "--symbols",
            "100",
            "--messages",
            "40000",
            "-o",
        ])
        .arg(&day)
        .status()
        .unwrap();
    assert!(st.success(), "feed-handler generate");
    let log = |name: &str| std::fs::File::create(work.join(format!("{name}.log"))).unwrap();
    let spawn = |args: &[&std::ffi::OsStr], name: &str| {
        let mut c = command(bin.join(args[0]));
        c.args(&args[1..])
            .env("ROCEBUS_DIR", work.join("counters"))
            .env("RUST_LOG", "warn")
            .stdout(log(&format!("{name}.out")))
            .stderr(log(name));
        Started(c.spawn().unwrap_or_else(|e| panic!("starting {name}: {e}")))
    };
    let logs = || {
        ["feed-handler", "order-gateway", "replay", "engine_cpp"]
            .iter()
            .map(|n| tail(&work.join(format!("{n}.log"))))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let fh_cfg = work.join("feed-handler.toml");
    let gw_cfg = work.join("order-gateway.toml");
    // The feed handler first: the gateway subscribes to its bus for reference prices.
    let mut fh = spawn(
        &[
            "feed-handler".as_ref(),
            "run".as_ref(),
            "--config".as_ref(),
            fh_cfg.as_os_str(),
        ],
        "feed-handler",
    );
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(
        fh.0.try_wait().unwrap().is_none(),
        "feed-handler exited at start\n{}",
        logs()
    );
    let mut gw = spawn(
        &[
            "order-gateway".as_ref(),
            "run".as_ref(),
            "--venue".as_ref(),
            "sim".as_ref(),
            "--config".as_ref(),
            gw_cfg.as_os_str(),
        ],
        "order-gateway",
    );
    let t = std::time::Instant::now();
    let exe = link("engine_cpp", "c++", work);
    eprintln!("linked engine_cpp in {:.1} s", t.elapsed().as_secs_f64());
    assert!(
        gw.0.try_wait().unwrap().is_none(),
        "order-gateway exited at start\n{}",
        logs()
    );
    let mut engine = Started(
        command(&exe)
            .arg(work.join("sample-engine.toml"))
            .arg(&fh_cfg)
            .arg(&addr)
            .arg(&addr)
            .arg("20")
            .stdout(std::process::Stdio::piped())
            .stderr(log("engine_cpp"))
            .spawn()
            .expect("starting engine_cpp"),
    );
    // Its stdout, line by line, to learn when it is subscribed and logged on.
    let (tx, rx) = std::sync::mpsc::channel();
    let out = engine.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut stdout = Vec::new();
    let ready = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !stdout.iter().any(|l: &String| l == "engine_cpp: ready") {
        let left = ready.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => stdout.push(l),
            Err(_) => panic!(
                "engine_cpp not ready in 90 s ({:?})\n{}",
                engine.0.try_wait(),
                logs()
            ),
        }
    }
    // The exchange opens once the engine is subscribed and logged on.
    let _replay = spawn(
        &[
            "feed-handler".as_ref(),
            "replay".as_ref(),
            day.as_os_str(),
            "--group".as_ref(),
            "239.1.1.1:26477".as_ref(),
            "--rate".as_ref(),
            "2000".as_ref(),
            "--retrans-port".as_ref(),
            "26478".as_ref(),
        ],
        "replay",
    );
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(st) = engine.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(180),
            "engine_cpp still running after 180 s\n{}",
            logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    stdout.extend(rx.try_iter());
    eprintln!("engine_cpp traded in {:.1} s", t.elapsed().as_secs_f64());
    let stdout = stdout.join("\n");
    assert!(
        status.success() && stdout.contains("engine_cpp: 20 orders acknowledged and filled"),
        "engine_cpp: {status}\nstdout:\n{stdout}\n{}",
        logs()
    );
    eprintln!("{stdout}");
    assert!(
        gw.0.try_wait().unwrap().is_none(),
        "order-gateway died\n{}",
        logs()
    );
    assert!(
        fh.0.try_wait().unwrap().is_none(),
        "feed-handler died\n{}",
        logs()
    );
}
