//! The etcd client code checked in under `src/etcd/` is what tonic-prost-build generates from
//! the protos under `proto/`: this test generates it again (client only, no server) into a
//! temporary directory and compares the files byte for byte. With `ILB_REGENERATE_ETCD=1` it
//! writes them into `src/etcd/` instead, which is how they are made.
//!
//! Only this test needs protoc, found through `PROTOC` or `protoc` on the PATH (Debian:
//! `protobuf-compiler`); building the crate does not. Without it the test says so on stderr and
//! passes, unless `ILB_REQUIRE_PROTOC=1` (CI), where it fails.
#![allow(clippy::disallowed_methods)] // a test of checked-in files: reads the environment, reads and writes files

use std::path::{Path, PathBuf};

const CRATE: &str = env!("CARGO_MANIFEST_DIR");

/// The protos compiled, as etcd-client 0.21.1 compiles them, without v3lock.
const PROTOS: &[&str] = &[
    "etcd/api/authpb/auth.proto",
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
];

/// The generated files checked in: one per package of `PROTOS`.
const GENERATED: &[&str] = &["authpb.rs", "etcdserverpb.rs", "mvccpb.rs", "v3electionpb.rs"];

/// Also generated, for the HTTP-gateway and OpenAPI annotations the protos import, but not
/// checked in: no code of `GENERATED` refers to them (checked below).
const UNUSED: &[&str] = &["google.api.rs", "grpc.gateway.protoc_gen_openapiv2.options.rs"];

/// Whether protoc can be run, or `false` (after saying so) when the test should skip.
fn protoc_available() -> bool {
    let found = std::env::var_os("PROTOC").is_some()
        || std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("protoc").is_file()));
    match found {
        true => true,
        false if std::env::var("ILB_REQUIRE_PROTOC").as_deref() == Ok("1") => {
            panic!("ILB_REQUIRE_PROTOC=1 but no protoc: set PROTOC or put protoc on the PATH")
        }
        false => {
            eprintln!(
                "skipping: no protoc, so the checked-in etcd code is not compared with the protos \
                 (set PROTOC or put protoc on the PATH; Debian: apt-get install protobuf-compiler)"
            );
            false
        }
    }
}

/// Generates the etcd client code into `out`, a fresh directory.
fn generate(out: &Path) {
    if out.exists() {
        std::fs::remove_dir_all(out).expect("remove the previous output");
    }
    std::fs::create_dir_all(out).expect("create the output directory");
    let proto = Path::new(CRATE).join("proto");
    let protos: Vec<PathBuf> = PROTOS.iter().map(|p| proto.join(p)).collect();
    tonic_prost_build::configure()
        .build_server(false)
        .out_dir(out)
        .compile_protos(&protos, &[proto])
        .expect("tonic-prost-build generates the etcd client code");
}

#[test]
fn the_checked_in_etcd_code_is_generated_from_the_protos() {
    if !protoc_available() {
        return;
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("etcd-protos");
    generate(&out);
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .expect("list the generated files")
        .map(|entry| entry.expect("a generated file").file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    let mut expected: Vec<&str> = GENERATED.iter().chain(UNUSED).copied().collect();
    expected.sort_unstable();
    assert_eq!(written, expected, "tonic-prost-build wrote other files than the checked-in and unused ones");
    let checked_in = Path::new(CRATE).join("src/etcd");
    let regenerate = std::env::var("ILB_REGENERATE_ETCD").as_deref() == Ok("1");
    let mut stale = Vec::new();
    for file in GENERATED {
        let generated = std::fs::read(out.join(file)).expect("read a generated file");
        let text = String::from_utf8_lossy(&generated);
        for unused in ["super::google", "super::grpc"] {
            assert!(!text.contains(unused), "{file} refers to {unused}: check that package's file in too");
        }
        let path = checked_in.join(file);
        if regenerate {
            std::fs::write(&path, &generated).expect("write a generated file into src/etcd");
            eprintln!("wrote {}", path.display());
        } else if std::fs::read(&path).ok().as_ref() != Some(&generated) {
            stale.push(format!("src/etcd/{file} differs from {}", out.join(file).display()));
        }
    }
    assert!(
        stale.is_empty(),
        "the checked-in etcd code is not what the protos generate (regenerate it with \
         `ILB_REGENERATE_ETCD=1 cargo test -p ilb-controlplane --test etcd_protos`):\n{}",
        stale.join("\n")
    );
}
