//! Compiles the C examples to object files (`OUT_DIR/NAME.o`) on the build
//! host, for `tests/c_examples.rs`, which only links them against the
//! library. The soft-RoCE guest is emulated (TCG): compiling a C file there
//! takes some 40 s, linking an object a few. A failing compiler does not
//! fail the library's build (an engine depending on this crate needs no C
//! examples): its message goes to `OUT_DIR/NAME.err` for the tests to show.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=include");
    for (file, compiler, std) in [
        ("ipc_pingpong.c", "cc", "-std=c11"),
        ("orders_echo.c", "cc", "-std=c11"),
        ("ipc_cpp.cpp", "c++", "-std=c++17"),
        ("orders_cpp.cpp", "c++", "-std=c++17"),
        ("engine_cpp.cpp", "c++", "-std=c++17"),
    ] {
        println!("cargo:rerun-if-changed=examples/{file}");
        let name = file.split('.').next().unwrap();
        let (obj, err) = (
            out.join(format!("{name}.o")),
            out.join(format!("{name}.err")),
        );
        let _ = std::fs::remove_file(&obj);
        let result = Command::new(compiler)
            .args([
                std, "-Wall", "-Wextra", "-Werror", "-O1", "-g", "-c", "-I", "include",
            ])
            .arg(format!("examples/{file}"))
            .arg("-o")
            .arg(&obj)
            .output();
        let msg = match result {
            Ok(o) if o.status.success() => String::new(),
            Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
            Err(e) => format!("running {compiler}: {e}"),
        };
        std::fs::write(&err, msg).expect("writing to OUT_DIR");
    }
}
