//! Where the store lives, as `--store` and the config file name it: `sled:PATH` or
//! `etcd://HOST:PORT[,HOST:PORT…][/PREFIX]`.

use std::{path::PathBuf, str::FromStr};

use gpuwarden_runtime::tls::ClientTls;

use super::StoreError;

/// Where the store lives: `sled:PATH` or `etcd://HOST:PORT[,HOST:PORT…][/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// sled in a directory.
    Sled(PathBuf),
    /// An etcd cluster.
    Etcd {
        /// `host:port` of each member.
        endpoints: Vec<String>,
        /// What every key starts with.
        prefix: String,
        /// TLS to etcd (its CA, and this client's certificate for `--client-cert-auth`); none:
        /// plain text. Not part of the URL: set from `--etcd-ca`/`--etcd-cert`/`--etcd-key`.
        tls: ClientTls,
    },
}

impl StoreSpec {
    /// The store of a state directory: sled in its `store/` folder.
    #[must_use]
    pub fn sled_in(state_dir: &std::path::Path) -> Self {
        Self::Sled(state_dir.join("store"))
    }
}

/// The prefix of an etcd store whose URL names none.
pub const DEFAULT_ETCD_PREFIX: &str = "gpuwarden/";

impl FromStr for StoreSpec {
    type Err = StoreError;

    fn from_str(given: &str) -> Result<Self, StoreError> {
        let bad = |reason: &str| StoreError::Spec {
            given: given.to_owned(),
            reason: reason.to_owned(),
        };
        if let Some(path) = given.strip_prefix("sled:") {
            if path.is_empty() {
                return Err(bad("no directory after sled:"));
            }
            return Ok(Self::Sled(PathBuf::from(path)));
        }
        let Some(rest) = given.strip_prefix("etcd://") else {
            return Err(bad("unknown scheme"));
        };
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
        for e in &endpoints {
            let port = e
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(bad(&format!("endpoint {e:?} is not HOST:PORT")));
            }
        }
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() {
            DEFAULT_ETCD_PREFIX.to_owned()
        } else {
            format!("{prefix}/")
        };
        Ok(Self::Etcd {
            endpoints,
            prefix,
            tls: ClientTls::default(),
        })
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sled(path) => write!(f, "sled:{}", path.display()),
            Self::Etcd {
                endpoints, prefix, ..
            } => {
                write!(
                    f,
                    "etcd://{}/{}",
                    endpoints.join(","),
                    prefix.trim_end_matches('/')
                )
            }
        }
    }
}
