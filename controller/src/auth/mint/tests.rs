//! Minting, checked by reading the certificates back as the server does.

use super::*;

#[test]
fn node_ids_that_would_escape_a_file_name_are_refused() {
    for bad in ["", "../x", "a/b", ".hidden", "-x", "node 1"] {
        assert!(
            matches!(check_node_id(bad), Err(MintError::InvalidNodeId { .. })),
            "{bad:?}"
        );
    }
    for good in ["node-1", "gpu-07.rack3.example", "n_1"] {
        assert!(check_node_id(good).is_ok(), "{good:?}");
    }
}

#[test]
fn node_ids_whose_files_would_replace_the_ca_or_another_identity_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    mint_into(dir.path(), &["node-1".into()], &["localhost".into()], 1).unwrap();
    let ca_key = std::fs::read(dir.path().join(CA_KEY)).unwrap();
    let ca_cert = std::fs::read(dir.path().join(CA_CERT)).unwrap();
    for bad in ["ca", "CA", "server", "user-alice", "Admin-ops"] {
        let err = mint_into(dir.path(), &[bad.into()], &[], 1).unwrap_err();
        assert!(
            matches!(err, MintError::InvalidNodeId { .. }),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("reserved"), "{err}");
    }
    assert_eq!(std::fs::read(dir.path().join(CA_KEY)).unwrap(), ca_key);
    assert_eq!(std::fs::read(dir.path().join(CA_CERT)).unwrap(), ca_cert);
    // Names merely containing them are fine.
    mint_into(dir.path(), &["ca-node".into(), "gpu-ca".into()], &[], 1).unwrap();
}

#[test]
fn half_a_ca_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(CA_KEY), "a key someone needs").unwrap();
    let err = mint_into(dir.path(), &["node-1".into()], &[], 1).unwrap_err();
    assert!(matches!(err, MintError::HalfCa { .. }), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(CA_KEY)).unwrap(),
        "a key someone needs"
    );
}

#[test]
fn a_node_certificate_names_its_node() {
    use rustls_pki_types::pem::PemObject as _;

    let ca = Ca::new(1).unwrap();
    let minted = ca.node("node-1", 1).unwrap();
    let der = rustls_pki_types::CertificateDer::from_pem_slice(minted.cert_pem.as_bytes()).unwrap();
    assert_eq!(
        super::super::identity::node_of_certificate(&der),
        Ok("node-1".to_owned())
    );
}

#[test]
fn client_certificates_name_their_user_or_admin() {
    use rustls_pki_types::pem::PemObject as _;

    let dir = tempfile::tempdir().unwrap();
    let minted = mint_clients_into(
        dir.path(),
        &[
            ("alice".into(), ClientRole::User),
            ("ops".into(), ClientRole::Admin),
        ],
        1,
    )
    .unwrap();
    assert!(!minted.reused_ca);
    for (file, name, role) in [
        ("user-alice.pem", "alice", ClientRole::User),
        ("admin-ops.pem", "ops", ClientRole::Admin),
    ] {
        let der = rustls_pki_types::CertificateDer::from_pem_file(dir.path().join(file)).unwrap();
        assert_eq!(
            super::super::clients::client_of_certificate(&der),
            Ok((name.to_owned(), role))
        );
    }
    assert!(matches!(
        mint_clients_into(dir.path(), &[("a/b".into(), ClientRole::User)], 1),
        Err(MintError::InvalidClientName { .. })
    ));
}

#[test]
fn minting_again_reuses_the_ca_and_its_certificates_still_chain() {
    use rustls_pki_types::{CertificateDer, UnixTime, pem::PemObject as _};

    let dir = tempfile::tempdir().unwrap();
    let first = mint_into(dir.path(), &["node-1".into()], &["localhost".into()], 1).unwrap();
    assert!(!first.reused_ca);
    let second = mint_into(dir.path(), &["node-2".into()], &[], 1).unwrap();
    assert!(second.reused_ca);
    assert_eq!(
        second.written,
        [dir.path().join("node-2.key"), dir.path().join("node-2.pem")]
    );

    let ca = CertificateDer::from_pem_file(dir.path().join(CA_CERT)).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        std::sync::Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let node2 = CertificateDer::from_pem_file(dir.path().join("node-2.pem")).unwrap();
    verifier
        .verify_client_cert(&node2, &[], UnixTime::now())
        .expect("a node minted with the reused CA chains to the first CA certificate");
    let mode = std::fs::metadata(dir.path().join(CA_KEY))
        .unwrap()
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
}
