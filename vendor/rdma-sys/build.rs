use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn link_rdma_core(lib_name: &str, pkg_name: &str, version: &str, include_paths: &mut Vec<String>) {
    let result: _ = pkg_config::Config::new()
        .atleast_version(version)
        .statik(false)
        .probe(lib_name);

    let lib = result.unwrap_or_else(|_| panic!("please install {pkg_name} {version})"));
    println!("found {pkg_name} {}", lib.version);

    for path in lib.include_paths {
        let path = path.to_str().expect("non-utf8 path");
        include_paths.push(path.to_owned());
    }
}

/// Enums used as bit sets (combined with bitwise-or): flags, masks, caps,
/// bits, fields, sizes. bindgen turns each into a newtype with `|`.
const BITFIELD_ENUMS: &[&str] = &[
    "ibv_device_cap_flags",
    "ibv_odp_transport_cap_bits",
    "ibv_odp_general_caps",
    "ibv_rx_hash_function_flags",
    "ibv_rx_hash_fields",
    "ibv_raw_packet_caps",
    "ibv_tm_cap_flags",
    "ibv_pci_atomic_op_size",
    "ibv_port_cap_flags",
    "ibv_port_cap_flags2",
    "ibv_create_cq_wc_flags",
    "ibv_wc_flags",
    "ibv_access_flags",
    "ibv_xrcd_init_attr_mask",
    "ibv_rereg_mr_flags",
    "ibv_srq_attr_mask",
    "ibv_srq_init_attr_mask", // TODO: need to be bitfield?
    "ibv_wq_init_attr_mask",
    "ibv_wq_flags",
    "ibv_wq_attr_mask",
    "ibv_ind_table_init_attr_mask",
    "ibv_qp_init_attr_mask", // TODO: need to be bitfield?
    "ibv_qp_create_flags",
    "ibv_qp_create_send_ops_flags",
    "ibv_qp_open_attr_mask",
    "ibv_qp_attr_mask",
    "ibv_send_flags",
    "ibv_ops_flags",
    "ibv_cq_attr_mask",
    "ibv_flow_flags",
    "ibv_flow_action_esp_mask",
    "ibv_cq_init_attr_mask",
    "ibv_create_cq_attr_flags",
    "ibv_parent_domain_init_attr_mask",
    "ibv_read_counters_flags",
    "ibv_values_mask",
    "ib_uverbs_access_flags",
    "rdma_cm_join_mc_attr_mask",
    "rdma_cm_mc_join_flags",
];

/// Enums turned into Rust enums.
const RUSTIFIED_ENUMS: &[&str] = &["ibv_event_type"];

/// rocebus: bindgen 0.59 derived `Debug` for bitfield-enum newtypes and
/// rustified enums even with `derive_debug(false)`; current bindgen does not.
/// Keep deriving it so the crate's API stays that of the published 0.3.0.
#[derive(Debug)]
struct EnumDebug;

impl bindgen::callbacks::ParseCallbacks for EnumDebug {
    fn add_derives(&self, info: &bindgen::callbacks::DeriveInfo<'_>) -> Vec<String> {
        if BITFIELD_ENUMS.contains(&info.name) || RUSTIFIED_ENUMS.contains(&info.name) {
            vec!["Debug".into()]
        } else {
            Vec::new()
        }
    }
}

/// rocebus: the libclang to load, unless `LIBCLANG_PATH` says.
///
/// bindgen (clang-sys) loads the newest libclang it finds, even one installed
/// without its compiler headers (`stddef.h` & co.; on Debian `libclang1-N`
/// comes without `libclang-common-N-dev`), and then fails on the first system
/// header. On the Debian/Ubuntu layout (`/usr/lib/llvm-N/lib`), take the newest
/// LLVM that has both the library and those headers, so which versions happen
/// to be installed beside each other does not matter. Elsewhere, return None
/// and let clang-sys search as usual.
fn complete_libclang_dir() -> Option<PathBuf> {
    let mut best: Option<(u32, PathBuf)> = None;
    for entry in fs::read_dir("/usr/lib").ok()?.flatten() {
        let name = entry.file_name();
        let Some(version) = name
            .to_str()
            .and_then(|n| n.strip_prefix("llvm-"))
            .and_then(|v| v.parse::<u32>().ok())
        else {
            continue;
        };
        let lib = entry.path().join("lib");
        let has_library = fs::read_dir(&lib).is_ok_and(|files| {
            files.flatten().any(|f| {
                let f = f.file_name();
                let f = f.to_string_lossy();
                f.starts_with("libclang") && !f.starts_with("libclang-cpp") && f.contains(".so")
            })
        });
        // Builtin headers: lib/clang/14.0.6/include up to 15, lib/clang/16/include from 16.
        let has_headers = fs::read_dir(lib.join("clang")).is_ok_and(|dirs| {
            dirs.flatten()
                .any(|d| d.path().join("include/stddef.h").is_file())
        });
        if has_library && has_headers && best.as_ref().is_none_or(|(v, _)| version > *v) {
            best = Some((version, lib));
        }
    }
    best.map(|(_, lib)| lib)
}

fn main() {
    println!("cargo:rerun-if-changed=src/bindings.h");
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    if env::var_os("LIBCLANG_PATH").is_none() {
        if let Some(dir) = complete_libclang_dir() {
            println!("using libclang from {}", dir.display());
            // clang-sys reads LIBCLANG_PATH when bindgen loads libclang below;
            // nothing else runs in this process yet.
            env::set_var("LIBCLANG_PATH", dir);
        }
    }
    let mut include_paths: Vec<String> = Vec::new();

    {
        let lib_name = "libibverbs";
        let pkg_name = "libibverbs-dev";
        let version = "1.8.28";
        link_rdma_core(lib_name, pkg_name, version, &mut include_paths);
    }

    {
        let lib_name = "librdmacm";
        let pkg_name = "librdmacm-dev";
        let version = "1.2.28";
        link_rdma_core(lib_name, pkg_name, version, &mut include_paths);
    }

    {
        include_paths.sort_unstable();
        include_paths.dedup_by(|x, first| x == first);
        include_paths.push("/usr/include".into());
        println!("include paths: {:?}", include_paths);
    }

    let include_args = include_paths.iter().map(|p| format!("-I{}", p));

    let mut builder = bindgen::Builder::default();
    // Following ENUM will used with bitwise-or
    for name in BITFIELD_ENUMS {
        builder = builder.bitfield_enum(name);
    }
    for name in RUSTIFIED_ENUMS {
        builder = builder.rustified_enum(name);
    }
    let bindings = builder
        .clang_args(include_args)
        .header("src/bindings.h")
        .allowlist_function("ibv_.*")
        .allowlist_type("ibv_.*")
        .allowlist_function("rdma_.*")
        .allowlist_type("rdma_.*")
        .allowlist_type("verbs_.*")
        .allowlist_type("ib_uverbs_access_flags")
        // rocebus: bindgen 0.59 emitted these; current bindgen maps the
        // fixed-width C types straight to u8..u64 and would drop them.
        .allowlist_type("__uint(8|16|32|64)_t")
        //.allowlist_type("verbs_devices_ops")
        //.allowlist_var("verbs_provider_.*")
        .blocklist_type("in6_addr")
        .opaque_type("pthread_.*")
        .blocklist_type("sockaddr.*")
        .blocklist_type("timespec")
        .blocklist_type("ibv_ah_attr")
        .blocklist_type("ibv_async_event")
        .blocklist_type("ibv_flow_spec")
        .blocklist_type("ibv_gid")
        .blocklist_type("ibv_global_route")
        .blocklist_type("ibv_mw_bind_info")
        .blocklist_type("ibv_ops_wr")
        .blocklist_type("ibv_send_wr")
        .blocklist_type("ibv_wc")
        .blocklist_type("rdma_addr")
        .blocklist_type("rdma_cm_event")
        .blocklist_type("rdma_ib_addr")
        .blocklist_type("rdma_ud_param")
        // Following ENUM will be const in a sub-mod
        .constified_enum_module("ibv_node_type")
        .constified_enum_module("ibv_transport_type")
        .constified_enum_module("ibv_atomic_cap")
        .constified_enum_module("ibv_mtu")
        .constified_enum_module("ibv_port_state")
        .constified_enum_module("ibv_wc_status")
        .constified_enum_module("ibv_wc_opcode")
        .constified_enum_module("ibv_mw_type")
        .constified_enum_module("ibv_rate")
        .constified_enum_module("ibv_srq_type")
        .constified_enum_module("ibv_wq_type")
        .constified_enum_module("ibv_wq_state")
        .constified_enum_module("ibv_qp_type")
        .constified_enum_module("ibv_qp_state")
        .constified_enum_module("ibv_mig_state")
        .constified_enum_module("ibv_wr_opcode")
        .constified_enum_module("ibv_ops_wr_opcode")
        .constified_enum_module("ibv_flow_attr_type")
        .constified_enum_module("ibv_flow_spec_type")
        .constified_enum_module("ibv_counter_description")
        .constified_enum_module("ibv_rereg_mr_err_code")
        .constified_enum_module("ib_uverbs_advise_mr_advice")
        .constified_enum_module("rdma_cm_event_type")
        .constified_enum_module("rdma_driver_id")
        .constified_enum_module("rdma_port_space")
        // unions with non-`Copy` fields other than `ManuallyDrop<T>` are unstable
        // for example: `pub eth: ibv_flow_spec_eth`
        // note: see issue #55149 <https://github.com/rust-lang/rust/issues/55149> for more information
        .derive_copy(true)
        .derive_debug(false)
        .derive_default(false)
        .generate_comments(false)
        //.generate_inline_functions(true)
        //.default_macro_constant_type(bindgen::MacroTypeVariation::Unsigned)
        .prepend_enum_name(false)
        // rocebus: the generated file is only include!d, never read, so it
        // is not formatted (no rustfmt or prettyplease needed at build time).
        .formatter(bindgen::Formatter::None)
        // rocebus: a fixed Rust target (at most the workspace's minimum,
        // 1.85) rather than whatever the bindgen release considers latest.
        .rust_target(bindgen::RustTarget::stable(82, 0).expect("a valid Rust target"))
        .size_t_is_usize(true)
        .disable_untagged_union()
        // rocebus: re-run when a header or LIBCLANG_PATH & co. change.
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .parse_callbacks(Box::new(EnumDebug))
        .generate()
        .expect("Unable to generate bindings");

    let out_dir = env::var_os("OUT_DIR").unwrap();
    let dest_path = Path::new(&out_dir).join("bindings.rs");

    bindings
        .write_to_file(dest_path)
        .expect("Could not write bindings");
}
