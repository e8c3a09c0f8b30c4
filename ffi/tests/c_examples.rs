//! The C examples, compiled with the system's C compiler against
//! `include/rocebus.h` and the shared library cargo built for these tests,
//! then run: on the host under valgrind's memcheck (leaks, invalid reads
//! and writes across the boundary), and in the soft-RoCE guest for the
//! orders path.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder of the library cargo built with these tests (`target/debug`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // target/debug/deps/c_examples-HASH -> target/debug
    let dir = exe.parent().and_then(Path::parent).expect("target dir").to_path_buf();
    assert!(
        dir.join("librocebus_ffi.so").is_file(),
        "no librocebus_ffi.so in {}",
        dir.display()
    );
    dir
}

/// Compiles `examples/NAME.c` (warnings are errors) into a folder of its
/// own and returns the program.
fn compile(name: &str, out: &Path) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let exe = out.join(name);
    let st = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join(format!("examples/{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lrocebus_ffi", "-lpthread"])
        .status()
        .expect("running cc (the system C compiler)");
    assert!(st.success(), "cc failed to build examples/{name}.c");
    exe
}

#[test]
fn c_ipc_pingpong_under_valgrind() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exe = compile("ipc_pingpong", tmp.path());
    let streams = tmp.path().join("streams");
    let out = Command::new("valgrind")
        .args([
            "--leak-check=full",
            "--error-exitcode=1",
            "--errors-for-leak-kinds=definite,possible",
            "--quiet",
        ])
        .arg(&exe)
        .arg(&streams)
        .arg("200")
        .output()
        .expect("running valgrind (apt-get install valgrind)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("ipc_pingpong: 200 round trips ok"),
        "ipc_pingpong under valgrind: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}
