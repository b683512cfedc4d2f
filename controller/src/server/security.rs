//! How the gRPC port speaks (plain text on loopback, `--insecure` plain text, or mutual TLS)
//! and how clients of the scheduler service authenticate (docs/architecture.md, "Nobody is
//! trusted by default").

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use crate::{
    auth::{
        clients::ClientAuth,
        grants::GrantFile,
        tls::{ReloadingConfig, ServerTlsFiles},
        tokens::TokenFile,
    },
    limits::Denials,
};

use super::ServeError;

/// How the controller's port speaks.
#[derive(Clone)]
pub enum Transport {
    /// Plain text: anyone who reaches the port can act as any node (the local one-command run).
    /// Served on loopback addresses only.
    PlainText,
    /// Plain text on any address, because the operator said `--insecure`: warned about at
    /// every start and exported as `gpuwarden.controller.insecure` = 1.
    Insecure,
    /// TLS with this configuration; agents must present a node certificate.
    Tls(Arc<ReloadingConfig>),
}

impl Transport {
    /// Plain text when none of the three files is given, TLS when all are.
    ///
    /// # Errors
    /// Only some are given, or the files can't be used.
    pub fn from_files(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        client_ca: Option<PathBuf>,
    ) -> Result<Self, ServeError> {
        match (cert, key, client_ca) {
            (None, None, None) => Ok(Self::PlainText),
            (Some(cert), Some(key), Some(client_ca)) => Ok(Self::Tls(Arc::new(
                ReloadingConfig::load(ServerTlsFiles {
                    cert,
                    key,
                    client_ca,
                })?,
            ))),
            (cert, key, client_ca) => {
                let missing: Vec<&str> = [
                    (cert.is_none(), "--tls-cert"),
                    (key.is_none(), "--tls-key"),
                    (client_ca.is_none(), "--tls-client-ca"),
                ]
                .into_iter()
                .filter_map(|(absent, flag)| absent.then_some(flag))
                .collect();
                Err(ServeError::IncompleteTls {
                    missing: missing.join(", "),
                })
            }
        }
    }

    /// Plain text, loopback-only or `--insecure`.
    #[must_use]
    pub fn is_plain_text(&self) -> bool {
        !matches!(self, Self::Tls(_))
    }

    /// Plain text on `addr` is served only on loopback, or when the operator said `--insecure`
    /// (docs/architecture.md, "Nobody is trusted by default").
    ///
    /// # Errors
    /// [`ServeError::PlainTextExposed`] for [`Transport::PlainText`] on any other address.
    pub fn check_exposure(&self, addr: SocketAddr) -> Result<(), ServeError> {
        match self {
            Self::PlainText if !addr.ip().is_loopback() => Err(ServeError::PlainTextExposed {
                addr,
                what: "anyone who reaches it could act as any node and read every token",
            }),
            _ => Ok(()),
        }
    }
}

/// How the port speaks and how clients of the scheduler service authenticate.
///
/// Clients are authenticated when the port speaks TLS (by their certificate, or a token) or a
/// token file is given (by their token); with neither, every client is an admin.
#[derive(Clone)]
pub struct Security {
    /// Plain text or TLS.
    pub transport: Transport,
    /// Bearer tokens for clients.
    pub tokens: Option<Arc<TokenFile>>,
    /// What users may bind sessions to ([`crate::auth::grants`]); without a file, their own
    /// managed cgroups only.
    pub grants: Arc<GrantFile>,
}

impl From<Transport> for Security {
    /// `transport` with no token file.
    fn from(transport: Transport) -> Self {
        Self {
            transport,
            tokens: None,
            grants: Arc::default(),
        }
    }
}

impl Security {
    /// How clients of the scheduler service authenticate, their refusals counted in
    /// `denials` (the server's bounds').
    #[must_use]
    pub fn clients(&self, denials: &Arc<Denials>) -> ClientAuth {
        ClientAuth::new(
            self.tokens.clone(),
            matches!(self.transport, Transport::Tls(_)),
        )
        .with_grants(Arc::clone(&self.grants))
        .with_insecure_agents(matches!(self.transport, Transport::Insecure))
        .with_denials(Arc::clone(denials))
    }
}
