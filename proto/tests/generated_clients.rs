//! The commands `docs/api.md` gives for generating a client make the files it names: protoc's
//! own Java and Python generators (Debian's `protobuf-compiler`, which `cargo xtask setup`
//! installs) read the proto's package options. Go needs `protoc-gen-go`, which is not
//! installed here, so its option is not exercised.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// A scratch folder removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gpuwarden-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch folder");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn protos() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto")
}

/// Runs `protoc -I proto/proto <out> gpuwarden/v1/gpuwarden.proto`, as docs/api.md says.
fn protoc(out: &str) {
    let status = Command::new("protoc")
        .arg("-I")
        .arg(protos())
        .arg(out)
        .arg(protos().join("gpuwarden/v1/gpuwarden.proto"))
        .status()
        .expect("protoc is not installed: run `cargo xtask setup` (Debian's protobuf-compiler)");
    assert!(status.success(), "protoc {out}: {status}");
}

#[test]
fn java_classes_land_in_the_documented_package() {
    let scratch = Scratch::new("java-out");
    protoc(&format!("--java_out={}", scratch.0.display()));
    let package = scratch.0.join("com/github/gpuwarden/v1");
    // One file per message (java_multiple_files), the outer class named as documented.
    for class in ["Session", "CreateSessionRequest", "GpuwardenProto"] {
        let file = package.join(format!("{class}.java"));
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{} was not generated: {e}", file.display()));
        assert!(
            text.contains("package com.github.gpuwarden.v1;"),
            "{} declares another package",
            file.display()
        );
    }
}

#[test]
fn the_python_module_follows_the_file_path() {
    let scratch = Scratch::new("python-out");
    protoc(&format!("--python_out={}", scratch.0.display()));
    let module = scratch.0.join("gpuwarden/v1/gpuwarden_pb2.py");
    let text = std::fs::read_to_string(&module)
        .unwrap_or_else(|e| panic!("{} was not generated: {e}", module.display()));
    assert!(
        text.contains("gpuwarden.v1"),
        "{} names no gpuwarden.v1",
        module.display()
    );
}
