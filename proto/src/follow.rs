//! Following the leader among several controllers: the list agents and clients are given
//! (`--controller a,b,c`), and the hint a standby answers with.
//!
//! A standby answers `UNAVAILABLE` with the leader's `host:port` in the [`LEADER_METADATA`]
//! metadata. A caller that gets such an answer tries that address next; one that gets any other
//! failure tries the next controller of its list. A single URL whose name resolves to several
//! addresses (a Kubernetes headless Service) works the same way: whichever pod answers, a standby
//! names the leader.

/// The metadata key a standby names the leader in.
pub const LEADER_METADATA: &str = "gpuwarden-leader";

/// The leader a standby named in `status`, if it did.
#[must_use]
pub fn leader_hint(status: &tonic::Status) -> Option<String> {
    if status.code() != tonic::Code::Unavailable {
        return None;
    }
    status
        .metadata()
        .get(LEADER_METADATA)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// A `--controller` list that can't be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FollowError {
    /// Nothing was given.
    #[error("no controller URL given")]
    Empty,
    /// One entry is not an `http://` or `https://` URL with a host.
    #[error("controller URL {0:?} is not http://HOST:PORT or https://HOST:PORT")]
    Url(String),
}

/// The controllers to try, in order, and the leader last named by a standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controllers {
    urls: Vec<String>,
    next: usize,
    hint: Option<String>,
}

impl Controllers {
    /// Parses a comma-separated list of URLs.
    ///
    /// # Errors
    /// The list is empty or an entry is not an http(s) URL with a host.
    pub fn parse(list: &str) -> Result<Self, FollowError> {
        let urls: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        if urls.is_empty() {
            return Err(FollowError::Empty);
        }
        for url in &urls {
            let valid = url
                .parse::<http::Uri>()
                .ok()
                .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
                .is_some_and(|u| u.host().is_some_and(|h| !h.is_empty()));
            if !valid {
                return Err(FollowError::Url(url.clone()));
            }
        }
        Ok(Self {
            urls,
            next: 0,
            hint: None,
        })
    }

    /// The URL to try now: the leader a standby named, else the list's current entry.
    #[must_use]
    pub fn current(&self) -> &str {
        self.hint.as_deref().unwrap_or(&self.urls[self.next])
    }

    /// Every URL of the list.
    #[must_use]
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Records that the current one failed with `status` (`None`: no answer at all): follow the
    /// leader it named, or go on to the next of the list.
    pub fn failed(&mut self, status: Option<&tonic::Status>) {
        match status.and_then(leader_hint) {
            Some(leader) => {
                // The leader is reached the way the list's controllers are (http or https).
                let scheme = self.urls[self.next]
                    .split_once("://")
                    .map_or("http", |(scheme, _)| scheme);
                self.hint = Some(format!("{scheme}://{leader}"));
            }
            None => {
                if self.hint.take().is_none() {
                    self.next = (self.next + 1) % self.urls.len();
                }
            }
        }
    }
}

impl std::fmt::Display for Controllers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.urls.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standby(leader: &str) -> tonic::Status {
        let mut status = tonic::Status::unavailable("standby");
        status
            .metadata_mut()
            .insert(LEADER_METADATA, leader.parse().expect("ascii"));
        status
    }

    #[test]
    fn a_list_is_tried_in_turn_and_a_named_leader_first() {
        let mut c = Controllers::parse("http://a:1, http://b:2,http://c:3").expect("valid");
        assert_eq!(c.current(), "http://a:1");
        c.failed(None);
        assert_eq!(c.current(), "http://b:2");
        c.failed(Some(&standby("c:3")));
        assert_eq!(c.current(), "http://c:3");
        // The named leader died too: back to the list where it was.
        c.failed(None);
        assert_eq!(c.current(), "http://b:2");
        c.failed(Some(&tonic::Status::unavailable("no leader yet")));
        assert_eq!(c.current(), "http://c:3");
        c.failed(None);
        assert_eq!(c.current(), "http://a:1");
    }

    #[test]
    fn the_leader_is_reached_with_the_lists_scheme() {
        let mut c = Controllers::parse("https://ctl-0.ctl:50051").expect("valid");
        c.failed(Some(&standby("ctl-1.ctl:50051")));
        assert_eq!(c.current(), "https://ctl-1.ctl:50051");
    }

    #[test]
    fn only_an_unavailable_answer_names_a_leader() {
        let mut status = tonic::Status::permission_denied("no");
        status
            .metadata_mut()
            .insert(LEADER_METADATA, "x:1".parse().expect("ascii"));
        assert_eq!(leader_hint(&status), None);
        assert_eq!(leader_hint(&standby("x:1")).as_deref(), Some("x:1"));
    }

    #[test]
    fn bad_lists_say_which_entry() {
        assert_eq!(Controllers::parse(" , "), Err(FollowError::Empty));
        for bad in ["a:1", "ftp://a:1", "http://", "http://a:1,b"] {
            assert!(Controllers::parse(bad).is_err(), "{bad}");
        }
        let err = Controllers::parse("http://a:1,grpc://b:2").unwrap_err();
        assert_eq!(
            err.to_string(),
            "controller URL \"grpc://b:2\" is not http://HOST:PORT or https://HOST:PORT"
        );
    }
}
