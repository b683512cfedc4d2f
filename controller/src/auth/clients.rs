//! Who calls the scheduler service, and what they may do (docs/architecture.md, "Nobody is
//! trusted by default").
//!
//! A client proves who it is with a bearer token (`authorization: Bearer <token>`, checked
//! against the token file, see [`super::tokens`]) or a client certificate whose one identity
//! URI SAN names it:
//!
//! - `spiffe://gpuwarden/user/<name>` ([`USER_URI_PREFIX`]): a user, the owner `<name>`;
//! - `spiffe://gpuwarden/admin/<name>` ([`ADMIN_URI_PREFIX`]): an admin called `<name>`.
//!
//! A token wins over a certificate on the same call. A node's certificate
//! (`spiffe://gpuwarden/node/…`) is an agent's, and never acts as a client.
//!
//! A [`ClientRole::User`] creates, sees, watches and ends only sessions whose owner is its
//! name; an [`ClientRole::Admin`] sees and ends every session and may create sessions for any
//! owner. Without a token file and without TLS the controller is open: every caller is an
//! admin called `default` (the local one-command run; the server warns once).

use std::{net::SocketAddr, sync::Arc};

use tonic::{
    Request, Status,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};

use gpuwarden_types::{
    policy::QuotaPolicy,
    target::{Target, TargetScope},
};

pub use super::principal::{
    ADMIN_URI_PREFIX, Caller, ClientRole, Credential, USER_URI_PREFIX, UnknownRole, check_name,
};
use super::{
    denials::{DenialReason, Denials},
    grants::{self, GrantFile},
    principal::NODE_URI_PREFIX,
    tokens::TokenFile,
};

/// The caller's name when the controller is open (no token file, no TLS).
pub const OPEN_CALLER: &str = "default";

/// Why a client is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Neither a token nor a client certificate.
    #[error(
        "no credentials: send `authorization: Bearer <token>` or present a client certificate \
         naming {USER_URI_PREFIX}<name> or {ADMIN_URI_PREFIX}<name>"
    )]
    NoCredentials,
    /// An `authorization` header that is not `Bearer <token>`.
    #[error("malformed authorization metadata: expected `Bearer <token>`")]
    MalformedAuthorization,
    /// A token sent to a controller without a token file.
    #[error("bearer tokens are not accepted here: the controller has no token file")]
    TokensNotAccepted,
    /// A token not in the token file.
    #[error("unknown or revoked bearer token")]
    UnknownToken,
    /// The client certificate can't be parsed (rustls verified it, so this is rare).
    #[error("the client certificate can't be parsed: {reason}")]
    Unparsable {
        /// The parser's words.
        reason: String,
    },
    /// The client certificate names no user or admin.
    #[error(
        "the client certificate names no client (no URI SAN {USER_URI_PREFIX}<name> or \
         {ADMIN_URI_PREFIX}<name>)"
    )]
    NoClientIdentity,
    /// The client certificate names more than one client.
    #[error("the client certificate names more than one client: {names:?}")]
    AmbiguousClient {
        /// Every identity it names.
        names: Vec<String>,
    },
    /// A node's certificate on the scheduler service.
    #[error("node {node:?}'s certificate is an agent's: it can't act as a client")]
    NodeCertificate {
        /// The node it names.
        node: String,
    },
    /// A user naming a session id that is not one of its own (another's, or none).
    #[error("user {caller:?} may {action} only its own sessions, and none of them has id {id:?}")]
    NotYours {
        /// The user.
        caller: String,
        /// The id it named.
        id: String,
        /// What it tried ("end", "see").
        action: &'static str,
    },
    /// A user acting on another owner's sessions.
    #[error("user {caller:?} may {action} only its own sessions, not those of owner {owner:?}")]
    OtherOwner {
        /// The user.
        caller: String,
        /// The owner it named or whose session it touched.
        owner: String,
        /// What it tried ("end", "see", "create").
        action: &'static str,
    },
    /// A user calling what only an admin may.
    #[error("user {caller:?} may not {action}: only an admin may")]
    AdminOnly {
        /// The user.
        caller: String,
        /// What it tried ("set queue team-a").
        action: String,
    },
}

impl ClientError {
    /// The bounded reason it is counted under.
    #[must_use]
    pub fn reason(&self) -> DenialReason {
        match self {
            Self::NoCredentials => DenialReason::NoCredentials,
            Self::MalformedAuthorization | Self::TokensNotAccepted | Self::UnknownToken => {
                DenialReason::BadToken
            }
            Self::Unparsable { .. } | Self::NoClientIdentity | Self::AmbiguousClient { .. } => {
                DenialReason::NoClientIdentity
            }
            Self::NodeCertificate { .. } => DenialReason::NodeAsClient,
            Self::OtherOwner { .. } | Self::NotYours { .. } => DenialReason::OtherOwner,
            Self::AdminOnly { .. } => DenialReason::AdminOnly,
        }
    }

    /// The gRPC status: who is calling is unknown (`UNAUTHENTICATED`), or known and not
    /// allowed (`PERMISSION_DENIED`).
    #[must_use]
    pub fn to_status(&self) -> Status {
        let code = match self {
            Self::NodeCertificate { .. }
            | Self::OtherOwner { .. }
            | Self::NotYours { .. }
            | Self::AdminOnly { .. } => tonic::Code::PermissionDenied,
            _ => tonic::Code::Unauthenticated,
        };
        // The reason it is counted under, in capitals (docs/api.md, "Errors").
        gpuwarden_proto::details::Details::new(&self.reason().as_str().to_ascii_uppercase())
            .status(code, self.to_string())
    }
}

/// Counts and logs a refusal in `denials`; the status to answer with.
fn refuse(denials: &Denials, error: &ClientError, who: &str) -> Status {
    denials.refuse(error.reason(), who, error);
    error.to_status()
}

/// The client a certificate (DER) names.
///
/// # Errors
/// The certificate can't be parsed, names no client or several, or is a node's.
pub fn client_of_certificate(der: &[u8]) -> Result<(String, ClientRole), ClientError> {
    let der = rustls_pki_types::CertificateDer::from(der);
    let cert = webpki::EndEntityCert::try_from(&der).map_err(|e| ClientError::Unparsable {
        reason: e.to_string(),
    })?;
    let mut clients = Vec::new();
    let mut node = None;
    for uri in cert.valid_uri_names() {
        if let Some(name) = uri.strip_prefix(USER_URI_PREFIX) {
            clients.push((name.to_owned(), ClientRole::User));
        } else if let Some(name) = uri.strip_prefix(ADMIN_URI_PREFIX) {
            clients.push((name.to_owned(), ClientRole::Admin));
        } else if let Some(name) = uri.strip_prefix(NODE_URI_PREFIX) {
            node = Some(name.to_owned());
        }
    }
    match (clients.len(), node) {
        (1, None) => {
            let (name, role) = clients.remove(0);
            // The CA signed it, but a name this module would not mint is refused all the same.
            check_name(&name).map_err(|_| ClientError::NoClientIdentity)?;
            Ok((name, role))
        }
        (0, Some(node)) => Err(ClientError::NodeCertificate { node }),
        (0, None) => Err(ClientError::NoClientIdentity),
        _ => Err(ClientError::AmbiguousClient {
            names: clients.iter().map(|(name, role)| role.uri(name)).collect(),
        }),
    }
}

/// How the scheduler service authenticates its callers, and what it lets them bind sessions to.
#[derive(Clone)]
pub struct ClientAuth {
    tokens: Option<Arc<TokenFile>>,
    certificates: bool,
    grants: Arc<GrantFile>,
    /// Plain-text agents are taken though clients authenticate (`--insecure`).
    insecure_agents: bool,
    /// Where refusals are counted; each caller it names carries it.
    denials: Arc<Denials>,
}

impl ClientAuth {
    /// Every caller is an admin: neither a token file nor TLS (the local one-command run).
    #[must_use]
    pub fn open() -> Self {
        Self {
            tokens: None,
            certificates: false,
            grants: Arc::new(GrantFile::none()),
            insecure_agents: false,
            denials: Arc::default(),
        }
    }

    /// Tokens from `tokens` when given; client certificates when the port speaks TLS with a
    /// client CA (`certificates`). Open when neither.
    #[must_use]
    pub fn new(tokens: Option<Arc<TokenFile>>, certificates: bool) -> Self {
        Self {
            tokens,
            certificates,
            grants: Arc::new(GrantFile::none()),
            insecure_agents: false,
            denials: Arc::default(),
        }
    }

    /// The same, taking agents over plain text even though clients authenticate: only when
    /// the operator said `--insecure`.
    #[must_use]
    pub fn with_insecure_agents(mut self, insecure: bool) -> Self {
        self.insecure_agents = insecure;
        self
    }

    /// Whether an agent may call over plain text: when the controller is open (nobody
    /// authenticates) or the operator said `--insecure`. Otherwise an agent authenticates by
    /// its node certificate, as clients do by theirs or a token.
    #[must_use]
    pub fn admits_plain_text_agents(&self) -> bool {
        self.is_open() || self.insecure_agents
    }

    /// The same, counting its refusals (and its callers') in `denials`, the server's (by
    /// default, counters of its own).
    #[must_use]
    pub fn with_denials(mut self, denials: Arc<Denials>) -> Self {
        self.denials = denials;
        self
    }

    /// Where its refusals are counted.
    #[must_use]
    pub fn denials(&self) -> &Arc<Denials> {
        &self.denials
    }

    /// The same, with users' targets granted by `grants` ([`super::grants`]).
    #[must_use]
    pub fn with_grants(mut self, grants: Arc<GrantFile>) -> Self {
        self.grants = grants;
        self
    }

    /// The scope a session of `owner` that `caller` creates may bind `target` under.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` (logged and counted) naming the target or policy and the owner.
    pub fn authorize_target(
        &self,
        caller: &Caller,
        owner: &str,
        target: &Target,
        policy: QuotaPolicy,
        unconfined: bool,
    ) -> Result<TargetScope, Status> {
        grants::authorize(
            caller,
            owner,
            target,
            policy,
            unconfined,
            &self.grants.current(),
        )
        .map_err(|e| {
            self.denials
                .refuse(DenialReason::TargetNotGranted, &caller.name, &e);
            Status::permission_denied(e.to_string())
        })
    }

    /// Whether every caller is an admin.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.tokens.is_none() && !self.certificates
    }

    /// Whether bearer tokens are accepted.
    #[must_use]
    pub fn takes_tokens(&self) -> bool {
        self.tokens.is_some()
    }

    /// Who sent `request`.
    ///
    /// # Errors
    /// `UNAUTHENTICATED` without credentials, with a malformed, unknown or revoked token, or
    /// with a certificate that names no client; `PERMISSION_DENIED` for a node's certificate.
    /// Each is logged and counted.
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        if self.is_open() {
            return Ok(Caller {
                name: OPEN_CALLER.to_owned(),
                role: ClientRole::Admin,
                credential: Credential::Open,
                denials: Arc::clone(&self.denials),
            });
        }
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_owned(), |a: SocketAddr| a.to_string());
        self.identify(request)
            .map_err(|e| refuse(&self.denials, &e, &peer))
    }

    fn identify<T>(&self, request: &Request<T>) -> Result<Caller, ClientError> {
        if let Some(value) = request.metadata().get("authorization") {
            let token = value
                .to_str()
                .ok()
                .and_then(bearer)
                .ok_or(ClientError::MalformedAuthorization)?;
            let tokens = self.tokens.as_ref().ok_or(ClientError::TokensNotAccepted)?;
            let entry = tokens.lookup(token).ok_or(ClientError::UnknownToken)?;
            return Ok(Caller {
                name: entry.owner,
                role: entry.role,
                credential: Credential::Token,
                denials: Arc::clone(&self.denials),
            });
        }
        let leaf = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs)
            .and_then(|chain| chain.first().cloned());
        let Some(leaf) = leaf else {
            return Err(ClientError::NoCredentials);
        };
        let (name, role) = client_of_certificate(&leaf)?;
        Ok(Caller {
            name,
            role,
            credential: Credential::Certificate,
            denials: Arc::clone(&self.denials),
        })
    }
}

/// The token of an `authorization` value `Bearer <token>` (the scheme in any case).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// What a caller may do with whose sessions: the refusals are counted in the caller's
/// [`Denials`], the server's.
impl Caller {
    fn other_owner(&self, owner: &str, action: &'static str) -> Status {
        refuse(
            &self.denials,
            &ClientError::OtherOwner {
                caller: self.name.clone(),
                owner: owner.to_owned(),
                action,
            },
            &self.name,
        )
    }

    /// The owner of a session the caller creates naming `requested` (empty: the caller).
    ///
    /// # Errors
    /// `PERMISSION_DENIED` (counted) for a user naming another owner.
    pub fn owner_for_create(&self, requested: String) -> Result<String, Status> {
        if requested.is_empty() || requested == self.name {
            Ok(self.name.clone())
        } else if self.is_admin() {
            Ok(requested)
        } else {
            Err(self.other_owner(&requested, "create"))
        }
    }

    /// The owner filter of a session listing that asked for `requested` (empty: all the
    /// caller may see); empty means every owner.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` (counted) for a user asking for another owner's sessions.
    pub fn owner_filter(&self, requested: String) -> Result<String, Status> {
        if self.is_admin() || requested == self.name {
            Ok(requested)
        } else if requested.is_empty() {
            Ok(self.name.clone())
        } else {
            Err(self.other_owner(&requested, "see"))
        }
    }

    /// Whether the caller may `action` ("see", "end") the session `id`, whose owner is `owner`
    /// (`None`: no such session). A user gets the same answer for another owner's session as
    /// for none at all, so ids can't be probed; an admin learns that it does not exist.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` (counted) for a user and a session not its own or none;
    /// `NOT_FOUND` for an admin and no session.
    pub fn may_act_on_session(
        &self,
        owner: Option<&str>,
        id: &str,
        action: &'static str,
    ) -> Result<(), Status> {
        match owner {
            Some(owner) if self.may_see(owner) => Ok(()),
            None if self.is_admin() => {
                Err(gpuwarden_proto::details::Details::new("SESSION_NOT_FOUND")
                    .meta("id", id)
                    .status(tonic::Code::NotFound, format!("no session {id:?}")))
            }
            _ => Err(refuse(
                &self.denials,
                &ClientError::NotYours {
                    caller: self.name.clone(),
                    id: id.to_owned(),
                    action,
                },
                &self.name,
            )),
        }
    }

    /// Whether the caller may `action` (`set queue team-a`), which only an admin may.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` (counted) for a user.
    pub fn must_be_admin(&self, action: impl FnOnce() -> String) -> Result<(), Status> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(refuse(
                &self.denials,
                &ClientError::AdminOnly {
                    caller: self.name.clone(),
                    action: action(),
                },
                &self.name,
            ))
        }
    }

    /// Whether the caller may `action` ("see", "end") a session of `owner`.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` (counted) for a user and another owner's session.
    pub fn may_act_on(&self, owner: &str, action: &'static str) -> Result<(), Status> {
        if self.may_see(owner) {
            Ok(())
        } else {
            Err(self.other_owner(owner, action))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Caller {
        Caller {
            name: name.to_owned(),
            role: ClientRole::User,
            credential: Credential::Token,
            denials: Arc::default(),
        }
    }

    fn cert_with_uris(uris: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|s| rcgen::SanType::URI((*s).try_into().unwrap()))
            .collect();
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_certificate_names_a_user_or_an_admin() {
        let der = cert_with_uris(&["spiffe://gpuwarden/user/alice"]);
        assert_eq!(
            client_of_certificate(&der),
            Ok(("alice".to_owned(), ClientRole::User))
        );
        let der = cert_with_uris(&["spiffe://gpuwarden/admin/ops", "spiffe://other/x"]);
        assert_eq!(
            client_of_certificate(&der),
            Ok(("ops".to_owned(), ClientRole::Admin))
        );
    }

    #[test]
    fn node_and_ambiguous_certificates_are_no_clients() {
        let der = cert_with_uris(&["spiffe://gpuwarden/node/node-1"]);
        let err = client_of_certificate(&der).unwrap_err();
        assert_eq!(err.to_status().code(), tonic::Code::PermissionDenied);
        assert_eq!(err.reason(), DenialReason::NodeAsClient);

        let der = cert_with_uris(&[
            "spiffe://gpuwarden/user/alice",
            "spiffe://gpuwarden/admin/alice",
        ]);
        let err = client_of_certificate(&der).unwrap_err();
        assert!(matches!(err, ClientError::AmbiguousClient { .. }), "{err}");
        assert_eq!(err.to_status().code(), tonic::Code::Unauthenticated);

        let der = cert_with_uris(&["spiffe://gpuwarden/user/../x"]);
        assert_eq!(
            client_of_certificate(&der),
            Err(ClientError::NoClientIdentity)
        );
    }

    #[test]
    fn a_user_acts_only_as_itself() {
        let alice = user("alice");
        assert_eq!(alice.owner_for_create(String::new()).unwrap(), "alice");
        assert_eq!(alice.owner_for_create("alice".into()).unwrap(), "alice");
        let status = alice.owner_for_create("bob".into()).unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(status.message().contains("\"bob\""), "{}", status.message());
        assert_eq!(alice.denials.count_of(DenialReason::OtherOwner), 1);

        assert_eq!(alice.owner_filter(String::new()).unwrap(), "alice");
        assert!(alice.owner_filter("bob".into()).is_err());
        assert!(alice.may_act_on("alice", "end").is_ok());
        assert!(alice.may_act_on("bob", "end").is_err());
        // Each refusal counted once, under its reason; the ones allowed not at all.
        assert_eq!(alice.denials.count_of(DenialReason::OtherOwner), 3);
        assert_eq!(alice.denials.count_of(DenialReason::AdminOnly), 0);
    }

    #[test]
    fn an_admin_acts_for_anyone() {
        let ops = Caller {
            role: ClientRole::Admin,
            ..user("ops")
        };
        assert_eq!(ops.owner_for_create(String::new()).unwrap(), "ops");
        assert_eq!(ops.owner_for_create("bob".into()).unwrap(), "bob");
        assert_eq!(ops.owner_filter(String::new()).unwrap(), "");
        assert!(ops.may_act_on("bob", "end").is_ok());
    }

    #[test]
    fn an_open_controller_calls_everyone_the_default_admin() {
        let caller = ClientAuth::open().caller(&Request::new(())).unwrap();
        assert!(caller.is_admin());
        assert_eq!(caller.name, OPEN_CALLER);
    }

    #[test]
    fn certificates_only_refuse_a_call_without_credentials_or_with_a_token() {
        let auth = ClientAuth::new(None, true);
        let status = auth.caller(&Request::new(())).unwrap_err();
        assert_eq!(auth.denials().count_of(DenialReason::NoCredentials), 1);
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(
            status.message().contains("no credentials"),
            "{}",
            status.message()
        );
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("authorization", "Bearer abc".parse().unwrap());
        let status = auth.caller(&request).unwrap_err();
        assert!(
            status.message().contains("no token file"),
            "{}",
            status.message()
        );
        assert_eq!(auth.denials().count_of(DenialReason::BadToken), 1);
    }

    #[test]
    fn bearer_values() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("abc"), None);
    }

    #[test]
    fn names() {
        for good in ["alice", "team-a", "a.b_c", "alice@example.com"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-x", ".x", "a/b", "a b", "a\"b", &"x".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
