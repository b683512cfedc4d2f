//! Who an agent is: the node its client certificate names, and the check that it speaks only
//! for that node.
//!
//! The convention: a node's client certificate carries exactly one URI subject alternative
//! name `spiffe://gpuwarden/node/<node-id>` ([`NODE_URI_PREFIX`]). A URI, not a DNS name, so
//! a serving certificate from the same CA (`DNS:controller.example`) never passes for a node,
//! and no other `spiffe://gpuwarden/…` URI beside it, so a certificate that also names a user
//! or an admin passes for neither (the scheduler service refuses it too). The TLS layer checks
//! the extended key usage: a certificate with an EKU that lacks `clientAuth` (a serving
//! certificate) is refused at the handshake.

use std::net::SocketAddr;

use tonic::{
    Request, Status,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};

pub use super::principal::{NODE_URI_PREFIX, node_uri};
use super::{
    denials::{DenialReason, Denials},
    principal::IDENTITY_URI_PREFIX,
};

/// Why a caller may not act for a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// A TLS connection without a client certificate.
    #[error("no client certificate: an agent must present its node certificate")]
    NoCertificate,
    /// The certificate can't be parsed (rustls verified it, so this is rare).
    #[error("the client certificate can't be parsed: {reason}")]
    Unparsable {
        /// The parser's words.
        reason: String,
    },
    /// The certificate names no node.
    #[error("the client certificate names no node (no URI SAN {NODE_URI_PREFIX}<node-id>)")]
    NoNode,
    /// The certificate names more than one node.
    #[error("the client certificate names more than one node: {nodes:?}")]
    AmbiguousNodes {
        /// Every node it names.
        nodes: Vec<String>,
    },
    /// The certificate names a node and another gpuwarden identity (a user, an admin).
    #[error(
        "the client certificate names node(s) {nodes:?} and other identities {others:?}: a node certificate names its node only"
    )]
    MixedRoles {
        /// The nodes it names.
        nodes: Vec<String>,
        /// The other `spiffe://gpuwarden/…` URIs it carries.
        others: Vec<String>,
    },
    /// A plain-text agent call while clients must authenticate (a token file) and the operator
    /// did not say `--insecure`: nothing would prove which node it is.
    #[error(
        "agents must authenticate when clients do: serve TLS and give agents their node \
         certificates, or start the controller with --insecure to take plain-text agents"
    )]
    PlainTextAgent,
    /// The certificate names another node than the one the request speaks for.
    #[error("the client certificate is for node {certified:?}, not for node {claimed:?}")]
    Mismatch {
        /// The node the certificate names.
        certified: String,
        /// The node the request speaks for.
        claimed: String,
    },
}

impl IdentityError {
    /// The bounded reason it is counted under.
    #[must_use]
    pub fn reason(&self) -> DenialReason {
        match self {
            Self::NoCertificate => DenialReason::NoClientCertificate,
            Self::Unparsable { .. }
            | Self::NoNode
            | Self::AmbiguousNodes { .. }
            | Self::MixedRoles { .. } => DenialReason::NoNodeIdentity,
            Self::Mismatch { .. } => DenialReason::NodeMismatch,
            Self::PlainTextAgent => DenialReason::PlainTextAgent,
        }
    }

    /// The gRPC status the caller gets: who it is is unknown (`UNAUTHENTICATED`), or known and
    /// not allowed (`PERMISSION_DENIED`).
    #[must_use]
    pub fn to_status(&self) -> Status {
        let code = match self {
            Self::Mismatch { .. } => tonic::Code::PermissionDenied,
            _ => tonic::Code::Unauthenticated,
        };
        gpuwarden_proto::details::Details::new(&self.reason().as_str().to_ascii_uppercase())
            .status(code, self.to_string())
    }
}

/// The node a client certificate (DER) names.
///
/// A node certificate names its node and no other gpuwarden identity: one that also names a
/// user or an admin (or any other `spiffe://gpuwarden/…` URI) is refused, so that one CA
/// signing every role never yields a certificate that passes for two.
///
/// # Errors
/// The certificate can't be parsed, names no node or several, or names another identity too.
pub fn node_of_certificate(der: &[u8]) -> Result<String, IdentityError> {
    let der = rustls_pki_types::CertificateDer::from(der);
    let cert = webpki::EndEntityCert::try_from(&der).map_err(|e| IdentityError::Unparsable {
        reason: e.to_string(),
    })?;
    let mut nodes = Vec::new();
    let mut others = Vec::new();
    for uri in cert.valid_uri_names() {
        if let Some(node) = uri.strip_prefix(NODE_URI_PREFIX) {
            nodes.push(node.to_owned());
        } else if uri.starts_with(IDENTITY_URI_PREFIX) {
            others.push(uri.to_owned());
        }
    }
    if !others.is_empty() && !nodes.is_empty() {
        return Err(IdentityError::MixedRoles { nodes, others });
    }
    match nodes.len() {
        0 => Err(IdentityError::NoNode),
        1 => Ok(nodes.remove(0)),
        _ => Err(IdentityError::AmbiguousNodes { nodes }),
    }
}

/// Who sent a request to the agent service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A plain-text connection: nobody is authenticated, any claim is taken (the local
    /// one-command run; the server warned when it started).
    PlainText,
    /// A TLS connection whose verified client certificate names this node.
    Node {
        /// The node id.
        node: String,
        /// The remote address, for the log.
        addr: Option<SocketAddr>,
    },
}

impl Peer {
    /// The peer of `request`, from its connection.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` (logged and counted in `denials`) for a TLS connection without a
    /// client certificate or whose certificate names no single node.
    pub fn of<T>(request: &Request<T>, denials: &Denials) -> Result<Self, Status> {
        let Some(tls) = request.extensions().get::<TlsConnectInfo<TcpConnectInfo>>() else {
            return Ok(Self::PlainText);
        };
        let addr = tls.get_ref().remote_addr();
        let node = match tls.peer_certs() {
            None => Err(IdentityError::NoCertificate),
            Some(chain) => chain
                .first()
                .ok_or(IdentityError::NoCertificate)
                .and_then(|leaf| node_of_certificate(leaf)),
        };
        node.map(|node| Self::Node { node, addr })
            .map_err(|e| refuse(denials, &e, addr))
    }

    /// The peer of `request` when plain-text agents are admitted only if `plain_text` (the
    /// controller is open, or the operator said `--insecure`): an agent must authenticate
    /// whenever clients do (issue 33: a process on loopback registered as a node and received
    /// every tenant's allocations for it).
    ///
    /// # Errors
    /// As [`Self::of`]; and `UNAUTHENTICATED` (logged and counted in `denials`) for a
    /// plain-text peer when not `plain_text`.
    pub fn admitted<T>(
        request: &Request<T>,
        plain_text: bool,
        denials: &Denials,
    ) -> Result<Self, Status> {
        match Self::of(request, denials)? {
            Self::PlainText if !plain_text => {
                let addr = request
                    .extensions()
                    .get::<TcpConnectInfo>()
                    .and_then(TcpConnectInfo::remote_addr);
                Err(refuse(denials, &IdentityError::PlainTextAgent, addr))
            }
            peer => Ok(peer),
        }
    }

    /// Whether this peer may speak for `claimed`.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` (logged and counted in `denials`), naming both nodes, when the
    /// certificate names another node.
    pub fn speaks_for(&self, claimed: &str, denials: &Denials) -> Result<(), Status> {
        match self {
            Self::PlainText => Ok(()),
            Self::Node { node, .. } if node == claimed => Ok(()),
            Self::Node { node, addr } => Err(refuse(
                denials,
                &IdentityError::Mismatch {
                    certified: node.clone(),
                    claimed: claimed.to_owned(),
                },
                *addr,
            )),
        }
    }
}

/// Counts and logs a refusal in `denials`; the status to answer with.
fn refuse(denials: &Denials, error: &IdentityError, addr: Option<SocketAddr>) -> Status {
    let peer = addr.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
    denials.refuse(error.reason(), &peer, error);
    error.to_status()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with_sans(sans: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = sans
            .iter()
            .map(|s| {
                let value = (*s).try_into().unwrap();
                if s.contains("://") {
                    rcgen::SanType::URI(value)
                } else {
                    rcgen::SanType::DnsName(value)
                }
            })
            .collect();
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_node_is_the_one_uri_san_with_the_prefix() {
        let der = cert_with_sans(&["node-9.example", "spiffe://gpuwarden/node/node-1"]);
        assert_eq!(node_of_certificate(&der), Ok("node-1".to_owned()));
    }

    #[test]
    fn a_dns_name_alone_is_not_a_node() {
        let der = cert_with_sans(&["node-1", "spiffe://other/node/node-1"]);
        assert_eq!(node_of_certificate(&der), Err(IdentityError::NoNode));
    }

    #[test]
    fn two_nodes_in_one_certificate_are_refused() {
        let der = cert_with_sans(&[
            "spiffe://gpuwarden/node/node-1",
            "spiffe://gpuwarden/node/node-2",
        ]);
        let err = node_of_certificate(&der).unwrap_err();
        assert_eq!(err.reason(), DenialReason::NoNodeIdentity);
        assert_eq!(err.to_status().code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn a_node_certificate_that_also_names_a_user_or_admin_is_refused() {
        for other in [
            "spiffe://gpuwarden/user/alice",
            "spiffe://gpuwarden/admin/ops",
            "spiffe://gpuwarden/something-new/x",
        ] {
            let der = cert_with_sans(&["spiffe://gpuwarden/node/node-1", other]);
            let err = node_of_certificate(&der).unwrap_err();
            assert!(
                matches!(err, IdentityError::MixedRoles { .. }),
                "{other}: {err}"
            );
            assert_eq!(err.to_status().code(), tonic::Code::Unauthenticated);
        }
        // Foreign URIs (another trust domain) don't make it ambiguous.
        let der = cert_with_sans(&["spiffe://gpuwarden/node/node-1", "spiffe://other/user/x"]);
        assert_eq!(node_of_certificate(&der), Ok("node-1".to_owned()));
    }

    #[test]
    fn a_mismatch_is_permission_denied_naming_both_nodes_and_counted() {
        let peer = Peer::Node {
            node: "node-1".to_owned(),
            addr: None,
        };
        let denials = Denials::default();
        assert!(peer.speaks_for("node-1", &denials).is_ok());
        assert_eq!(denials.count_of(DenialReason::NodeMismatch), 0);
        let status = peer.speaks_for("node-2", &denials).unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("\"node-1\"") && status.message().contains("\"node-2\""),
            "{}",
            status.message()
        );
        assert_eq!(denials.count_of(DenialReason::NodeMismatch), 1);
    }

    #[test]
    fn plain_text_takes_any_claim() {
        let request = Request::new(());
        let denials = Denials::default();
        assert_eq!(Peer::of(&request, &denials).unwrap(), Peer::PlainText);
        assert!(Peer::PlainText.speaks_for("anyone", &denials).is_ok());
        assert!(
            DenialReason::ALL
                .iter()
                .all(|&reason| denials.count_of(reason) == 0)
        );
    }
}
