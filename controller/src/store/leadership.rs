//! Leadership on etcd: controllers campaign on an election backed by a lease, and the leader's
//! writes are fenced on its leadership key (docs/architecture.md, "One machine embeds, many use
//! etcd").
//!
//! Campaigning grants a lease of `ttl`, keeps it alive from a task of its own, and blocks until
//! this candidate leads. The election's key for this candidate was created at some revision;
//! while that key exists with that create revision, this candidate is the leader. A commit
//! guarded on it ([`Fence`]) lands only while the candidate still leads: a leader that was paused
//! past its lease, or cut off, finds its writes refused ([`StoreError::Deposed`]) instead of
//! overwriting its successor's.

use std::time::Duration;

use etcd_client::{Client, LeaderKey, ResignOptions};

use super::{
    StoreError,
    etcd::{EtcdKv, Fence},
};

/// This candidate's term as leader. Dropping it stops renewing the lease: the office lapses
/// within the TTL (resign to hand over at once).
pub struct Office {
    client: Client,
    leader: LeaderKey,
    /// The revision etcd was at when this candidate won.
    won_at: i64,
    lease: i64,
    keep_alive: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Office {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Office")
            .field("fence", &self.fence())
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Office {
    /// The fence this term's writes are guarded on.
    #[must_use]
    pub fn fence(&self) -> Fence {
        Fence {
            key: self.leader.key().to_vec(),
            revision: self.leader.rev(),
        }
    }

    /// The revision etcd was at when this term began: every write of earlier leaders is at or
    /// before it.
    #[must_use]
    pub fn won_at(&self) -> i64 {
        self.won_at
    }

    /// Whether the lease is still being renewed (the keep-alive task has not given up).
    #[must_use]
    pub fn renewing(&self) -> bool {
        !self.keep_alive.is_finished()
    }

    /// Steps down at once: the next candidate leads without waiting for the lease to lapse.
    ///
    /// # Errors
    /// etcd can't be reached (the office then lapses with the lease).
    pub async fn resign(mut self) -> Result<(), StoreError> {
        self.keep_alive.abort();
        let resigned = self
            .client
            .resign(Some(ResignOptions::new().with_leader(self.leader.clone())))
            .await;
        let _ = self.client.lease_revoke(self.lease).await;
        resigned.map(|_| ()).map_err(|e| StoreError::Io {
            what: "resigning the leadership".to_owned(),
            reason: e.to_string(),
        })
    }
}

impl Drop for Office {
    fn drop(&mut self) {
        self.keep_alive.abort();
    }
}

impl EtcdKv {
    fn election_name(&self, election: &str) -> String {
        format!("{}election/{election}", self.prefix())
    }

    /// Campaigns on `election` with `address` (what followers are told) and a lease of `ttl`;
    /// returns once this candidate leads.
    ///
    /// # Errors
    /// etcd can't be reached, or the lease lapsed before the election was won.
    pub async fn campaign(
        &self,
        election: &str,
        address: &str,
        ttl: Duration,
    ) -> Result<Office, StoreError> {
        let io = |what: &str, e: &etcd_client::Error| StoreError::Io {
            what: format!("{what} on {}", self.describe()),
            reason: e.to_string(),
        };
        let mut client = self.client().clone();
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let lease = client
            .lease_grant(ttl_secs, None)
            .await
            .map_err(|e| io("granting a lease", &e))?
            .id();
        let (mut keeper, mut answers) = client
            .lease_keep_alive(lease)
            .await
            .map_err(|e| io("keeping the lease alive", &e))?;
        // Renew three times per TTL; stop (and let the office lapse) when etcd stops answering.
        let keep_alive = tokio::spawn(async move {
            let mut tick = tokio::time::interval(ttl / 3);
            loop {
                tick.tick().await;
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match answers.message().await {
                    Ok(Some(answer)) if answer.ttl() > 0 => {}
                    _ => break,
                }
            }
        });
        // The campaigning client has no request timeout: a campaign waits for as long as
        // another candidate leads. Any failure gives the candidacy up, so that no key of a
        // candidate nobody holds is left in the queue.
        let won = match self
            .campaigner()
            .clone()
            .campaign(self.election_name(election), address, lease)
            .await
        {
            Ok(won) => won,
            Err(e) => {
                keep_alive.abort();
                let _ = client.lease_revoke(lease).await;
                return Err(io("campaigning", &e));
            }
        };
        let Some(leader) = won.leader().cloned() else {
            keep_alive.abort();
            let _ = client.lease_revoke(lease).await;
            return Err(StoreError::Io {
                what: format!("campaigning on {}", self.describe()),
                reason: "etcd answered without a leader key".to_owned(),
            });
        };
        Ok(Office {
            client,
            won_at: won
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision),
            leader,
            lease,
            keep_alive,
        })
    }

    /// The address the current leader of `election` campaigned with, if any leads.
    ///
    /// # Errors
    /// etcd can't be reached.
    pub async fn leader(&self, election: &str) -> Result<Option<String>, StoreError> {
        match self
            .client()
            .clone()
            .leader(self.election_name(election))
            .await
        {
            Ok(answer) => Ok(answer
                .kv()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())),
            // etcd answers "no leader" as an error status.
            Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("no leader") => Ok(None),
            Err(e) => Err(StoreError::Io {
                what: format!("asking for the leader on {}", self.describe()),
                reason: e.to_string(),
            }),
        }
    }
}
