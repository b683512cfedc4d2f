//! The distributed backend: etcd (v3 API), every key under one prefix.
//!
//! A commit is one etcd transaction per chunk of writes (etcd refuses a transaction of more than
//! 128 operations, or a request over 1.5 MiB, by default), committed in order; etcd has made a
//! transaction durable on a quorum when it answers. Reads page through ranges so that a store of
//! any size loads within gRPC's message limit.

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};

use gpuwarden_runtime::tls::ClientTls;

use super::{StoreError, Write};

/// Operations per transaction: etcd's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;
/// Bytes per transaction, below etcd's default 1.5 MiB request limit.
const MAX_TXN_BYTES: usize = 1 << 20;
/// Keys per page when reading a range.
const PAGE: i64 = 256;

/// What a leader's commits are guarded on: its election key and the revision that created it
/// ([`super::leadership`] makes it; a commit here checks it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The election key (under the election's name).
    pub key: Vec<u8>,
    /// Its create revision: the fencing token.
    pub revision: i64,
}

impl Fence {
    /// The comparison a fenced transaction is guarded on.
    pub(super) fn compare(&self) -> Compare {
        Compare::create_revision(self.key.clone(), CompareOp::Equal, self.revision)
    }
}

/// An etcd cluster.
#[derive(Clone)]
pub struct EtcdKv {
    client: Client,
    /// For campaigns only: no request timeout. A campaign waits as long as another candidate
    /// leads, and etcd resigns a campaign whose request was cancelled, deleting the candidacy a
    /// retry would then wait on.
    campaigner: Client,
    endpoints: Vec<String>,
    prefix: String,
}

impl std::fmt::Debug for EtcdKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdKv")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdKv {
    /// Connects to `endpoints` (`host:port`), keeping every key under `prefix`; over TLS when
    /// `tls` names files.
    ///
    /// # Errors
    /// No endpoint answers.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        tls: &ClientTls,
    ) -> Result<Self, StoreError> {
        let scheme = if tls.is_empty() { "http" } else { "https" };
        let urls: Vec<String> = endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(5))
            // A member cut off from its quorum must not serve reads as if it were current.
            .with_require_leader(true)
            // A dead member is noticed by the connection, not only by a request's timeout.
            .with_keep_alive(
                std::time::Duration::from_secs(5),
                std::time::Duration::from_secs(5),
            );
        let config = urls
            .first()
            .map(|url| tls.config(url))
            .transpose()
            .map_err(|e| StoreError::Open {
                at: format!("etcd {}", endpoints.join(",")),
                reason: e.to_string(),
            })?
            .flatten();
        if let Some(config) = config {
            options = options.with_tls(config);
        }
        let open_error = |e: etcd_client::Error| StoreError::Open {
            at: format!("etcd {}", endpoints.join(",")),
            reason: e.to_string(),
        };
        let campaigner = Client::connect(&urls, Some(options.clone()))
            .await
            .map_err(open_error)?;
        let client = Client::connect(
            &urls,
            Some(options.with_timeout(std::time::Duration::from_secs(10))),
        )
        .await
        .map_err(open_error)?;
        let kv = Self {
            client,
            campaigner,
            endpoints: endpoints.to_owned(),
            prefix: prefix.to_owned(),
        };
        // The client connects lazily: ask once so that a wrong address fails here, not later.
        kv.get("meta/format_version")
            .await
            .map_err(|e| StoreError::Open {
                at: format!("etcd {}", endpoints.join(",")),
                reason: e.to_string(),
            })?;
        Ok(kv)
    }

    /// The endpoints and prefix, for messages.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "etcd {} (prefix {:?})",
            self.endpoints.join(","),
            self.prefix
        )
    }

    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    pub(super) fn campaigner(&self) -> &Client {
        &self.campaigner
    }

    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn error(&self, what: &str, e: &etcd_client::Error) -> StoreError {
        StoreError::Io {
            what: format!("{what} on {}", self.describe()),
            reason: e.to_string(),
        }
    }

    /// The value at `key`.
    ///
    /// # Errors
    /// etcd can't be reached or has no leader.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let response = self
            .client
            .kv_client()
            .get(self.full(key), None)
            .await
            .map_err(|e| self.error(key, &e))?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Every key under `prefix`, in key order.
    ///
    /// # Errors
    /// etcd can't be reached or has no leader.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self.list_at(prefix, None).await?.0)
    }

    /// Every key under `prefix` as of one revision (`at`, or the current one), and that
    /// revision: every page is read at the same revision, so the whole is consistent.
    ///
    /// # Errors
    /// etcd can't be reached or has no leader, or `at` was compacted away.
    pub async fn list_at(
        &self,
        prefix: &str,
        at: Option<i64>,
    ) -> Result<(Vec<(String, Vec<u8>)>, i64), StoreError> {
        let start = self.full(prefix);
        let end = prefix_end(start.as_bytes());
        let mut from = start.into_bytes();
        let mut out = Vec::new();
        let mut revision = at;
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if let Some(revision) = revision {
                options = options.with_revision(revision);
            }
            let response = self
                .client
                .kv_client()
                .get(from.clone(), Some(options))
                .await
                .map_err(|e| self.error(prefix, &e))?;
            // The first page fixes the revision the others are read at.
            let at = *revision.get_or_insert_with(|| {
                response
                    .header()
                    .map_or(0, etcd_client::ResponseHeader::revision)
            });
            for kv in response.kvs() {
                let key = String::from_utf8_lossy(kv.key());
                let key = key.strip_prefix(&self.prefix).unwrap_or(&key).to_owned();
                out.push((key, kv.value().to_vec()));
            }
            match response.kvs().last() {
                Some(last) if response.more() => {
                    // The next page starts just after the last key.
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok((out, at)),
            }
        }
    }

    /// Writes `value` at `key` if it holds `expected` (`None`: absent); whether it did.
    ///
    /// # Errors
    /// etcd can't be reached or has no leader.
    pub async fn compare_and_put(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<bool, StoreError> {
        let full = self.full(key);
        let guard = match expected {
            // A key never created (or deleted) has create revision 0.
            None => Compare::create_revision(full.clone(), CompareOp::Equal, 0),
            Some(v) => Compare::value(full.clone(), CompareOp::Equal, v.to_vec()),
        };
        let txn = Txn::new()
            .when([guard])
            .and_then([TxnOp::put(full, value.to_vec(), None)]);
        let response = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| self.error(key, &e))?;
        Ok(response.succeeded())
    }

    /// Commits `writes` in order, in as few transactions as etcd's limits allow, each guarded on
    /// `fence` when given.
    ///
    /// # Errors
    /// etcd can't be reached or has no leader; the fence no longer holds
    /// ([`StoreError::Deposed`]). The chunks before the failed one are committed.
    pub async fn commit(&self, writes: &[Write], fence: Option<&Fence>) -> Result<(), StoreError> {
        for chunk in chunks(writes) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|w| match w {
                    Write::Put { key, value } => TxnOp::put(self.full(key), value.clone(), None),
                    Write::Delete { key } => TxnOp::delete(self.full(key), None),
                })
                .collect();
            let txn = match fence {
                Some(fence) => Txn::new().when([fence.compare()]),
                None => Txn::new(),
            };
            let answer = self
                .client
                .kv_client()
                .txn(txn.and_then(ops))
                .await
                .map_err(|e| self.error("commit", &e))?;
            if !answer.succeeded() {
                return Err(StoreError::Deposed {
                    reason: format!(
                        "the leadership key {:?} (revision {}) is gone from {}: another controller leads",
                        String::from_utf8_lossy(fence.map_or(&[][..], |f| &f.key)),
                        fence.map_or(0, |f| f.revision),
                        self.describe()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// `writes` cut into runs that fit one transaction each.
fn chunks(writes: &[Write]) -> Vec<&[Write]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, w) in writes.iter().enumerate() {
        let size = w.key().len() + w.value().map_or(0, <[u8]>::len);
        if i > start && (i - start == MAX_TXN_OPS || bytes + size > MAX_TXN_BYTES) {
            out.push(&writes[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < writes.len() {
        out.push(&writes[start..]);
    }
    out
}

/// The first key after every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: to the end of the key space.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, len: usize) -> Write {
        Write::Put {
            key: key.to_owned(),
            value: vec![b'x'; len],
        }
    }

    #[test]
    fn chunks_respect_the_op_and_byte_limits_and_keep_order() {
        let many: Vec<Write> = (0..300).map(|i| put(&format!("s/{i}"), 10)).collect();
        let sizes: Vec<usize> = chunks(&many).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [128, 128, 44]);
        let big: Vec<Write> = (0..5).map(|i| put(&format!("s/{i}"), 400 << 10)).collect();
        let sizes: Vec<usize> = chunks(&big).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [2, 2, 1]);
        // One write larger than the limit still goes (etcd will say if it is too large).
        let huge = [put("s/h", 2 << 20)];
        assert_eq!(chunks(&huge).len(), 1);
        assert!(chunks(&[]).is_empty());
    }

    #[test]
    fn a_prefix_ends_at_its_successor() {
        assert_eq!(prefix_end(b"gw/sessions/"), b"gw/sessions0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0]);
    }
}
