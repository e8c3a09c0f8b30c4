//! The C and C++ examples, compiled by `build.rs` with the system's
//! compilers against `include/rocebus.h`, linked here against the shared
//! library cargo built for these tests, then run: on the host under valgrind's memcheck (leaks, invalid reads
//! and writes across the boundary), and in the soft-RoCE guest for the
//! orders path.

mod common;

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

/// Issue 45: the examples build with a plain Makefile and the system compilers, no cargo
/// (`examples/Makefile`, as an engine team would build them), and what it builds runs:
/// the C ipc ping-pong it linked.
#[test]
fn the_makefile_builds_every_example_and_they_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let out = command("make")
        .arg("-C")
        .arg(&examples)
        .arg(format!("LIBDIR={}", lib_dir().display()))
        .arg(format!("OUT={}", tmp.path().display()))
        .output()
        .expect("running make (apt-get install make)");
    assert!(
        out.status.success(),
        "make: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for p in [
        "ipc_pingpong",
        "orders_echo",
        "ipc_cpp",
        "orders_cpp",
        "engine_cpp",
    ] {
        assert!(tmp.path().join(p).is_file(), "make built no {p}");
    }
    let run = command(tmp.path().join("ipc_pingpong"))
        .arg(tmp.path().join("streams"))
        .arg("100")
        .output()
        .expect("running the ipc_pingpong make built");
    assert!(
        run.status.success()
            && String::from_utf8_lossy(&run.stdout).contains("ipc_pingpong: 100 round trips ok"),
        "ipc_pingpong (make): {}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
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

/// valgrind's exit status when memcheck found an error or a leak
/// (`--error-exitcode`): distinct from the examples' own statuses (1 to 5).
const MEMCHECK_FOUND: i32 = 97;

/// The suppressions for what libibverbs, librdmacm and the rxe provider
/// do that memcheck cannot follow (each entry says why it is not ours).
fn rdma_suppressions() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rdma-memcheck.supp")
}

/// `exe` under valgrind's memcheck, for the examples that use the RDMA
/// device: any error, and any definite or possible leak, ends it with
/// [`MEMCHECK_FOUND`]. `--fair-sched=yes`: valgrind runs one thread at a
/// time, and the examples' threads busy-poll each other; with the default
/// lock one spinning thread can starve the one it waits for.
fn memcheck_command(exe: &Path) -> Command {
    let mut c = command("valgrind");
    c.args([
        "--tool=memcheck",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,possible",
        "--show-leak-kinds=definite,possible",
        "--fair-sched=yes",
        "--num-callers=30",
    ])
    .arg(format!("--error-exitcode={MEMCHECK_FOUND}"))
    .arg(format!("--suppressions={}", rdma_suppressions().display()))
    .arg(exe);
    c
}

/// Checks what memcheck said about a run of [`memcheck_command`]: it ran
/// (its summary is there, so a missing valgrind cannot pass) and found
/// nothing.
fn assert_memcheck_clean(name: &str, status: std::process::ExitStatus, stderr: &str) {
    assert!(
        status.code() != Some(MEMCHECK_FOUND),
        "{name}: memcheck found errors or leaks:\n{stderr}"
    );
    assert!(
        stderr.contains("ERROR SUMMARY: 0 errors"),
        "{name}: no clean memcheck summary ({status}):\n{stderr}"
    );
}

/// Links example `name` with `compiler` and runs it against an orders
/// listener on this host's RDMA device at `port`, for `rounds` round trips;
/// under memcheck when `memcheck`.
fn orders_example(name: &str, compiler: &str, port: u16, rounds: u32, memcheck: bool) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = std::time::Instant::now();
    let exe = link(name, compiler, tmp.path());
    eprintln!("linked {name} in {:.1} s", t.elapsed().as_secs_f64());
    let addr = std::net::SocketAddr::new(common::local_ip(), port);
    let t = std::time::Instant::now();
    let mut cmd = if memcheck {
        memcheck_command(&exe)
    } else {
        command(&exe)
    };
    let out = cmd
        .arg(addr.to_string())
        .arg(rounds.to_string())
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{name} ran in {:.1} s", t.elapsed().as_secs_f64());
    if memcheck {
        assert_memcheck_clean(name, out.status, &stderr);
    }
    assert!(
        out.status.success() && stdout.contains(&format!("{name}: {rounds} round trips ok")),
        "{name}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_c_orders_echo() {
    orders_example("orders_echo", "cc", 7561, 300, false);
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_cpp_orders_echo() {
    orders_example("orders_cpp", "c++", 7562, 200, false);
}

/// `orders_echo` under memcheck: no invalid read or write and no leak
/// across the boundary on the RDMA path (connect, accept, offer, claims,
/// poll callbacks, free). Fewer round trips than the native run: memcheck
/// is some 30 times slower, and each round trip takes the same path.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_c_orders_echo_under_memcheck() {
    orders_example("orders_echo", "cc", 7563, 40, true);
}

/// `orders_cpp` (through `rocebus.hpp`) under memcheck.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_cpp_orders_echo_under_memcheck() {
    orders_example("orders_cpp", "c++", 7564, 40, true);
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
    engine_against_feed_handler_and_gateway(20, false);
}

/// The same C++ engine under memcheck: no invalid read or write and no leak
/// across the boundary on the engine's whole path (configuration, market data
/// from the bus with its callbacks, the gateway session's logon, orders,
/// responses, close). A few orders: memcheck is some 30 times slower, and
/// each order takes the same path.
#[test]
#[ignore = "rdma: runs feed-handler and order-gateway on an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_cpp_engine_against_feed_handler_and_gateway_under_memcheck() {
    engine_against_feed_handler_and_gateway(5, true);
}

/// The engine example against the demo pipeline, trading `orders` orders;
/// under memcheck when `memcheck`.
fn engine_against_feed_handler_and_gateway(orders: u32, memcheck: bool) {
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
    let addr = common::local_ip().to_string();
    let configs = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("ffi is inside the workspace")
        .join("configs/demo");
    for f in ["feed-handler", "sample-engine", "order-gateway"] {
        let text = std::fs::read_to_string(configs.join(format!("{f}.toml"))).unwrap();
        let mut text = text
            .replace("198.18.0.1", &addr)
            .replace("/tmp/rocebus-demo", &work.display().to_string());
        // Under memcheck the engine answers some 30 times slower: the limits on
        // its logon and on either side's silence allow for that.
        for (key, usual, slow) in [
            (
                "sample-engine",
                "gateway_timeout_ms = 3000",
                "gateway_timeout_ms = 60000",
            ),
            (
                "order-gateway",
                "logon_timeout_ms = 5000",
                "logon_timeout_ms = 60000\nengine_timeout_ms = 60000",
            ),
        ] {
            if memcheck && f == key {
                assert!(text.contains(usual), "{f}.toml no longer has {usual:?}");
                text = text.replace(usual, slow);
            }
        }
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
    // memcheck starts (reads the library's debug information) and runs far slower.
    let slow = if memcheck { 4 } else { 1 };
    let mut engine_cmd = if memcheck {
        memcheck_command(&exe)
    } else {
        command(&exe)
    };
    let mut engine = Started(
        engine_cmd
            .arg(work.join("sample-engine.toml"))
            .arg(&fh_cfg)
            .arg(&addr)
            .arg(&addr)
            .arg(orders.to_string())
            .arg((120 * slow).to_string())
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
    let ready = std::time::Instant::now() + std::time::Duration::from_secs(90 * slow);
    while !stdout.iter().any(|l: &String| l == "engine_cpp: ready") {
        let left = ready.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => stdout.push(l),
            Err(_) => panic!(
                "engine_cpp not ready in {} s ({:?})\n{}",
                90 * slow,
                engine.0.try_wait(),
                logs()
            ),
        }
    }
    // The exchange opens once the engine is subscribed and logged on. Under memcheck
    // the engine reads some 30 times slower: at the usual rate it falls behind, its
    // quotes go stale at every loss and snapshot, and it never sees a fresh one.
    let rate = if memcheck { "100" } else { "2000" };
    let _replay = spawn(
        &[
            "feed-handler".as_ref(),
            "replay".as_ref(),
            day.as_os_str(),
            "--group".as_ref(),
            "239.1.1.1:26477".as_ref(),
            "--rate".as_ref(),
            rate.as_ref(),
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
            t.elapsed() < std::time::Duration::from_secs(180 * slow),
            "engine_cpp still running after {} s\n{}",
            180 * slow,
            logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    stdout.extend(rx.try_iter());
    eprintln!("engine_cpp traded in {:.1} s", t.elapsed().as_secs_f64());
    let stdout = stdout.join("\n");
    if memcheck {
        let stderr = std::fs::read_to_string(work.join("engine_cpp.log")).unwrap_or_default();
        assert_memcheck_clean("engine_cpp", status, &format!("{stderr}\n{}", logs()));
    }
    // The engine gave up while the gateway still runs: what both were doing then (stop
    // 54's CI and a loaded pre-check saw an engine hear nothing from a live gateway).
    let gw_pid = gw.0.id().to_string();
    let running = || {
        let run = |c: &mut Command| {
            c.output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout).into_owned()
                        + &String::from_utf8_lossy(&o.stderr)
                })
                .unwrap_or_else(|e| format!("({e})"))
        };
        let stat = run(command(bin.join("rocebus"))
            .args(["stat", "--once"])
            .env("ROCEBUS_DIR", work.join("counters")));
        // Counters at zero left out (`NAME 0 -`).
        let stat: Vec<&str> = stat.lines().filter(|l| !zero_counter(l)).collect();
        let qps = run(Command::new("rdma").args(["resource", "show", "qp"]));
        // Bounded: attaching to a process in a starved guest can take minutes.
        let stacks = run(Command::new("timeout")
            .args(["30", "gdb", "-batch", "-p", &gw_pid])
            .args(["-ex", "thread apply all bt 12"]));
        let stacks: Vec<&str> = stacks
            .lines()
            .filter(|l| l.starts_with("Thread") || l.starts_with('#'))
            .collect();
        format!(
            "--- rocebus stat (non-zero):\n{}\n--- rdma resource show qp:\n{qps}\n--- order-gateway threads:\n{}",
            stat.join("\n"),
            stacks.join("\n")
        )
    };
    let ok = status.success()
        && stdout.contains(&format!(
            "engine_cpp: {orders} orders acknowledged and filled"
        ));
    assert!(
        ok,
        "engine_cpp: {status}\nstdout:\n{stdout}\n{}\n{}",
        logs(),
        if ok || gw.0.try_wait().unwrap().is_some() {
            String::new()
        } else {
            running()
        }
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

/// A `rocebus stat` line of a counter at zero (`... NAME 0 -`).
fn zero_counter(line: &str) -> bool {
    let t: Vec<&str> = line.split_whitespace().collect();
    t.len() >= 2 && t[t.len() - 2] == "0" && t[t.len() - 1] == "-"
}
