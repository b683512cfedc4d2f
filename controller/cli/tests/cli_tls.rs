//! `gpuwarden` against a controller that serves TLS: `https://` with `--ca` (or
//! `GPUWARDEN_CA`) and a client certificate (`--cert`/`--key` or `GPUWARDEN_CERT`/`GPUWARDEN_KEY`)
//! works, the CA alone is refused as unauthenticated, without the CA the command exits 2 saying
//! what is missing, and a controller certificate from another CA is refused.

use std::{path::Path, sync::Arc};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        mint,
        tls::{ReloadingConfig, ServerTlsFiles},
    },
    server::Transport,
};
use gpuwarden_test_support::{cli, controller::TestController};

/// A TLS controller with certificates minted into `scratch/certs`, and its `https://` URL.
fn start_tls_controller(scratch: &Path) -> (TestController, String) {
    let certs = scratch.join("certs");
    mint::mint_into(&certs, &["node-1".to_owned()], &["127.0.0.1".to_owned()], 1).expect("minted");
    mint::mint_clients_into(&certs, &[("ops".to_owned(), ClientRole::Admin)], 1)
        .expect("minted the admin");
    let tls = ReloadingConfig::load(ServerTlsFiles::minted(&certs)).expect("TLS files load");
    let ctl = TestController::builder(&scratch.join("controller"))
        .security(Transport::Tls(Arc::new(tls)))
        .start();
    let url = ctl.url();
    (ctl, url)
}

fn gpuwarden(url: &str, args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    cli::gpuwarden_with(url, args, env)
}

#[test]
fn https_with_the_ca_works_and_without_it_exits_2() {
    let scratch = gpuwarden_test_support::scratch("cli-tls");
    let (_ctl, url) = start_tls_controller(scratch.path());
    let ca = scratch.path().join("certs").join(mint::CA_CERT);

    let certs = scratch.path().join("certs");
    let ca_flag = ca.to_string_lossy().into_owned();
    let (cert, key) = (certs.join("admin-ops.pem"), certs.join("admin-ops.key"));
    let (code, out, err) = gpuwarden(
        &url,
        &[
            "--ca",
            &ca_flag,
            "--cert",
            &cert.to_string_lossy(),
            "--key",
            &key.to_string_lossy(),
            "slot",
            "ls",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.trim_start().starts_with('['), "{out}");

    // The same from the environment.
    let (code, _, err) = gpuwarden(
        &url,
        &["node", "ls"],
        &[
            ("GPUWARDEN_CA", &ca),
            ("GPUWARDEN_CERT", &cert),
            ("GPUWARDEN_KEY", &key),
        ],
    );
    assert_eq!(code, 0, "{err}");

    // The CA alone proves no identity; a node's certificate is an agent's, not a client's.
    let (code, _, err) = gpuwarden(&url, &["--ca", &ca_flag, "slot", "ls"], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("Unauthenticated") && err.contains("no credentials"),
        "{err}"
    );
    let (code, _, err) = gpuwarden(
        &url,
        &["node", "ls"],
        &[
            ("GPUWARDEN_CA", &ca),
            ("GPUWARDEN_CERT", &certs.join("node-1.pem")),
            ("GPUWARDEN_KEY", &certs.join("node-1.key")),
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("PermissionDenied"), "{err}");

    let (code, _, err) = gpuwarden(&url, &["node", "ls"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs a CA certificate"), "{err}");
}

#[test]
fn a_controller_signed_by_another_ca_is_refused() {
    let scratch = gpuwarden_test_support::scratch("cli-tls-rogue");
    let (_ctl, url) = start_tls_controller(scratch.path());
    let other = scratch.path().join("other");
    mint::mint_into(&other, &[], &[], 1).expect("another CA");
    let (code, _, err) = gpuwarden(
        &url,
        &["node", "ls"],
        &[("GPUWARDEN_CA", &other.join(mint::CA_CERT))],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&url), "{err}");
}
