//! TLS files as every gpuwarden binary reads them: PEM certificates and keys, with errors that
//! name the file, and the client side of a connection to the controller (the agent's link and
//! the CLI).
//!
//! A client with an `https://` controller URL verifies the controller against a CA file and,
//! where given, presents a client certificate (an agent's names its node). The files are read
//! each time an endpoint is built, so a client that reconnects picks up rotated files.

use std::path::{Path, PathBuf};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// A TLS file that can't be used, or TLS settings that don't fit the URL.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// The file can't be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// What the file should hold ("CA certificate", "private key" …).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file holds nothing usable of what it should.
    #[error("{what} {path}: {reason}")]
    Invalid {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A certificate without its key, or a key without its certificate.
    #[error("a client certificate needs both a certificate and a key file (given: {given})")]
    Incomplete {
        /// The one that was given.
        given: PathBuf,
    },
    /// An `https://` URL without a CA to verify the controller with.
    #[error("{url}: an https:// controller needs a CA certificate file to verify it")]
    NoCa {
        /// The URL.
        url: String,
    },
    /// TLS files with a plain-text URL: the files would be silently unused.
    #[error("{url} is plain text, but TLS files were given: use an https:// URL")]
    PlainTextUrl {
        /// The URL.
        url: String,
    },
    /// The TLS stack refused the files (e.g. a key that does not match its certificate).
    #[error("TLS settings refused: {0}")]
    Refused(#[source] tonic::transport::Error),
}

/// Reads every PEM certificate in `path` (a chain, or a CA bundle); at least one.
///
/// # Errors
/// The file can't be read or holds no valid certificate.
pub fn read_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let pem = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, what, e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid(path, what, "no PEM certificate in it".to_owned()));
    }
    Ok(certs)
}

/// Reads the first PEM private key (PKCS#8, PKCS#1 or SEC1) in `path`.
///
/// # Errors
/// The file can't be read or holds no valid key.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    const WHAT: &str = "private key";
    let pem = read(path, WHAT)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| invalid(path, WHAT, e.to_string()))
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn invalid(path: &Path, what: &'static str, reason: String) -> TlsFileError {
    TlsFileError::Invalid {
        what,
        path: path.to_owned(),
        reason,
    }
}

/// A client's TLS files for connecting to the controller; all optional, all paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA that signs the controller's serving certificate.
    pub ca: Option<PathBuf>,
    /// This client's certificate (chain), presented to the controller.
    pub cert: Option<PathBuf>,
    /// The private key of [`Self::cert`].
    pub key: Option<PathBuf>,
}

impl ClientTls {
    /// Whether any file is given.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// `endpoint` with TLS for an `https://` URL, reading the files now (so a reconnect sees
    /// rotated files); a plain `http://` endpoint is returned as it is when no file is given.
    ///
    /// # Errors
    /// An https URL without a CA, TLS files with an http URL, a file that can't be read or
    /// parsed, a certificate without its key, or a pair the TLS stack refuses.
    pub fn apply(&self, endpoint: Endpoint) -> Result<Endpoint, TlsFileError> {
        match self.config(&endpoint.uri().to_string())? {
            Some(config) => endpoint.tls_config(config).map_err(TlsFileError::Refused),
            None => Ok(endpoint),
        }
    }

    /// The TLS configuration for `url`, the files read now: `None` for a plain `http://` URL
    /// with no file given.
    ///
    /// # Errors
    /// As [`Self::apply`].
    pub fn config(&self, url: &str) -> Result<Option<ClientTlsConfig>, TlsFileError> {
        if !url.starts_with("https://") {
            return if self.is_empty() {
                Ok(None)
            } else {
                Err(TlsFileError::PlainTextUrl {
                    url: url.to_owned(),
                })
            };
        }
        let ca_path = self.ca.as_deref().ok_or_else(|| TlsFileError::NoCa {
            url: url.to_owned(),
        })?;
        // Read and checked here, so a bad file is named instead of failing every handshake.
        read_certs(ca_path, "CA certificate")?;
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca_path, "CA certificate")?));
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                read_certs(cert, "certificate")?;
                read_key(key)?;
                config = config.identity(Identity::from_pem(
                    read(cert, "certificate")?,
                    read(key, "private key")?,
                ));
            }
            (Some(given), None) | (None, Some(given)) => {
                return Err(TlsFileError::Incomplete {
                    given: given.clone(),
                });
            }
            (None, None) => {}
        }
        Ok(Some(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(url: &'static str) -> Endpoint {
        Endpoint::from_static(url)
    }

    #[test]
    fn plain_text_without_files_is_left_alone_and_with_files_refused() {
        let none = ClientTls::default();
        assert!(none.apply(endpoint("http://127.0.0.1:1")).is_ok());
        let ca = ClientTls {
            ca: Some("/nonexistent/ca.pem".into()),
            ..ClientTls::default()
        };
        let err = ca.apply(endpoint("http://127.0.0.1:1")).unwrap_err();
        assert!(matches!(err, TlsFileError::PlainTextUrl { .. }), "{err}");
    }

    #[test]
    fn https_needs_a_ca_and_names_a_missing_file() {
        let err = ClientTls::default()
            .apply(endpoint("https://127.0.0.1:1"))
            .unwrap_err();
        assert!(matches!(err, TlsFileError::NoCa { .. }), "{err}");
        let missing = ClientTls {
            ca: Some("/nonexistent/ca.pem".into()),
            ..ClientTls::default()
        };
        let err = missing.apply(endpoint("https://127.0.0.1:1")).unwrap_err();
        assert!(matches!(err, TlsFileError::Read { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn a_file_without_certificates_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("empty.pem");
        std::fs::write(&file, "not pem\n").unwrap();
        let err = read_certs(&file, "CA certificate").unwrap_err();
        assert!(matches!(err, TlsFileError::Invalid { .. }), "{err}");
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
        let err = read_key(&file).unwrap_err();
        assert!(matches!(err, TlsFileError::Invalid { .. }), "{err}");
    }

    #[test]
    fn a_certificate_without_its_key_is_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["ca".to_owned()]).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
        let tls = ClientTls {
            ca: Some(dir.path().join("ca.pem")),
            cert: Some(dir.path().join("node.pem")),
            key: None,
        };
        let err = tls.apply(endpoint("https://127.0.0.1:1")).unwrap_err();
        assert!(matches!(err, TlsFileError::Incomplete { .. }), "{err}");
        assert!(
            ClientTls {
                cert: None,
                ..tls.clone()
            }
            .apply(endpoint("https://127.0.0.1:1"))
            .is_ok()
        );
    }
}
