//! Which controllers to reach and how: the `--controller` list and each URL checked, TLS
//! applied, and why a link ended or could not start.

use gpuwarden_proto::follow::{Controllers, FollowError};
use gpuwarden_runtime::tls::{ClientTls, TlsFileError};
use tonic::transport::Endpoint;

/// Why the link ended or could not start.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The controller list can't be used: fatal, retrying would not help.
    #[error("--controller: {0}")]
    InvalidList(#[from] FollowError),
    /// The controller URL can't be used: fatal, retrying would not help.
    #[error("invalid controller URL {url:?}: {source}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        #[source]
        source: tonic::transport::Error,
    },
    /// A TLS file is missing or unusable, or TLS settings don't fit the URL: fatal, the
    /// agent stops its link naming the file instead of retrying.
    #[error(transparent)]
    Tls(#[from] TlsFileError),
    /// No connection (the controller is down or unreachable).
    #[error("cannot connect: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// The controller refused the registration.
    #[error("registration refused: {}", .0.message())]
    Register(#[source] tonic::Status),
    /// The stream was refused or broke.
    #[error("stream broke: {}", .0.message())]
    Stream(#[source] tonic::Status),
    /// The stream's sending side closed (the connection went away).
    #[error("stream closed")]
    Closed,
}

impl LinkError {
    /// Whether retrying can't help (the agent stops instead).
    #[must_use]
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::InvalidUrl { .. } | Self::InvalidList(_) | Self::Tls(_)
        )
    }

    /// The controller's answer, when it gave one (a standby's names the leader).
    pub(super) fn status(&self) -> Option<&tonic::Status> {
        match self {
            Self::Register(s) | Self::Stream(s) => Some(s),
            _ => None,
        }
    }
}

/// The controllers of a `--controller` list, each checked.
///
/// # Errors
/// [`LinkError::InvalidList`] or [`LinkError::InvalidUrl`], naming the entry.
pub fn check_controllers(list: &str) -> Result<Controllers, LinkError> {
    let controllers = Controllers::parse(list)?;
    for url in controllers.urls() {
        check_url(url)?;
    }
    Ok(controllers)
}

/// The controller's endpoint.
///
/// # Errors
/// [`LinkError::InvalidUrl`], naming the URL.
pub fn check_url(url: &str) -> Result<Endpoint, LinkError> {
    Endpoint::from_shared(url.to_owned()).map_err(|source| LinkError::InvalidUrl {
        url: url.to_owned(),
        source,
    })
}

/// The controller's endpoint with its TLS settings, the files read now.
///
/// # Errors
/// [`LinkError::InvalidUrl`] or [`LinkError::Tls`], both fatal.
pub fn endpoint(url: &str, tls: &ClientTls) -> Result<Endpoint, LinkError> {
    Ok(tls.apply(check_url(url)?)?)
}
