//! `buf lint` and `buf breaking` on gpuwarden's protos (issue 40): `cargo xtask setup` installs
//! buf from the npm registry (`@bufbuild/buf` ships its binary there) into `target/buf`, and
//! `cargo xtask test` lints `proto/` against `proto/buf.yaml` and checks that nothing in it
//! breaks the `main` branch's protos (v1 grows additively: no field renumbered or retyped).

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::{status, target_dir, workspace};

/// The buf release installed, pinned.
const BUF_VERSION: &str = "1.75.0";

/// Where npm installs buf.
fn prefix() -> PathBuf {
    target_dir().join("buf")
}

/// The buf executable npm installs.
fn buf() -> PathBuf {
    prefix().join("node_modules").join(".bin").join("buf")
}

/// Whether the pinned buf is installed.
fn ready() -> bool {
    Command::new(buf())
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == BUF_VERSION
        })
}

/// Installs the pinned buf into `target/buf` unless it is there.
pub fn install() -> anyhow::Result<()> {
    if ready() {
        println!("setup: buf {BUF_VERSION} ready ({})", buf().display());
        return Ok(());
    }
    println!(
        "setup: installing buf {BUF_VERSION} from npm into {}",
        prefix().display()
    );
    std::fs::create_dir_all(prefix())?;
    // The package's binary is an optional per-platform dependency: no install script needed.
    status(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(prefix())
            .arg(format!("@bufbuild/buf@{BUF_VERSION}")),
    )
    .context("npm (Debian's `npm` package) installs buf")?;
    if !ready() {
        bail!("buf {BUF_VERSION} did not run after npm installed it");
    }
    Ok(())
}

/// The branch `buf breaking` compares against: `main`, else `origin/main`.
fn base() -> Option<&'static str> {
    ["main", "origin/main"].into_iter().find(|r| {
        Command::new("git")
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("{r}^{{commit}}"),
            ])
            .current_dir(workspace())
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// `buf lint`, then `buf breaking` against the base branch's `proto/proto`.
pub fn check() -> anyhow::Result<()> {
    let module = workspace().join("proto");
    status(Command::new(buf()).arg("lint").current_dir(&module))?;
    let Some(base) = base() else {
        bail!("buf breaking: neither `main` nor `origin/main` is in this clone; fetch main");
    };
    let against = prefix().join("against");
    if against.exists() {
        std::fs::remove_dir_all(&against)?;
    }
    std::fs::create_dir_all(&against)?;
    // The base's protos as files: buf compares two module roots.
    let archive = Command::new("git")
        .args(["archive", "--format=tar", base, "proto/proto"])
        .current_dir(workspace())
        .output()?;
    if !archive.status.success() {
        bail!(
            "git archive {base} proto/proto: {}",
            String::from_utf8_lossy(&archive.stderr)
        );
    }
    let tar = against.join("base.tar");
    std::fs::write(&tar, archive.stdout)?;
    status(
        Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(&against),
    )?;
    println!("buf breaking: against {base}");
    status(
        Command::new(buf())
            .arg("breaking")
            .arg("--against")
            .arg(against.join("proto").join("proto"))
            .current_dir(&module),
    )
}
