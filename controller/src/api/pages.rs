//! Pages of the lists other than sessions (issue 40; AIP-158): `ListNodes`,
//! `GetAllocationMap`, `ListProfiles` and `ListQueues`, each in the order of its key (node id,
//! class, queue name). A page token names the list and the last key sent, so an entry that
//! exists through the whole listing is on exactly one page whatever changes meanwhile. A page
//! size of 0 means every entry, as these lists answered before they had pages: a client that
//! knows nothing of pages is never cut short silently.

use base64::Engine as _;
use gpuwarden_proto::details::Details;
use tonic::{Code, Status};

/// Where one list's page starts, and how long it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pager {
    list: &'static str,
    after: Option<String>,
    size: usize,
}

impl Pager {
    /// The page `page_token` and `page_size` ask for, of the list `list`; sizes above `most`
    /// are `most`, keys in tokens are held to `max_key_len`.
    pub(super) fn new(
        list: &'static str,
        page_token: &str,
        page_size: u32,
        most: usize,
        max_key_len: usize,
    ) -> Result<Self, Status> {
        let size = match usize::try_from(page_size) {
            Ok(0) => usize::MAX,
            Ok(n) => n.min(most).max(1),
            Err(_) => most.max(1),
        };
        let after = if page_token.is_empty() {
            None
        } else {
            let bad = || {
                Details::new("INVALID_PAGE_TOKEN")
                    .field("page_token", "not a token this list gave")
                    .status(
                        Code::InvalidArgument,
                        format!("page_token: not a token {list} gave"),
                    )
            };
            if page_token.len() > (max_key_len + list.len() + 1) * 4 / 3 + 4 {
                return Err(bad());
            }
            let text = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(page_token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(bad)?;
            let key = text
                .strip_prefix(list)
                .and_then(|t| t.strip_prefix(':'))
                .ok_or_else(bad)?;
            Some(key.to_owned())
        };
        Ok(Self { list, after, size })
    }

    /// The key the page starts after (none: the first page).
    pub(super) fn after(&self) -> Option<&str> {
        self.after.as_deref()
    }

    /// Whether `key` comes after where the page starts.
    pub(super) fn admits(&self, key: &str) -> bool {
        self.after.as_deref().is_none_or(|after| key > after)
    }

    /// The page of `entries` (key, item), given in key order and all after [`Pager::after`],
    /// and the token of the next page (empty: none).
    pub(super) fn page<T>(
        &self,
        entries: impl IntoIterator<Item = (String, T)>,
    ) -> (Vec<T>, String) {
        let mut items = Vec::new();
        let mut last = None;
        for (key, item) in entries {
            if items.len() == self.size {
                let next = last.map_or_else(String::new, |last: String| {
                    base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .encode(format!("{}:{last}", self.list))
                });
                return (items, next);
            }
            items.push(item);
            last = Some(key);
        }
        (items, String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<(String, usize)> {
        (0..n).map(|i| (format!("n{i:05}"), i)).collect()
    }

    #[test]
    fn pages_hold_every_entry_once_and_tokens_belong_to_their_list() {
        let all = keys(10);
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let pager = Pager::new("nodes", &token, 3, 1_000, 64).unwrap();
            let (page, next) = pager.page(
                all.iter()
                    .filter(|(k, _)| pager.admits(k))
                    .map(|(k, i)| (k.clone(), *i)),
            );
            assert!(page.len() <= 3);
            seen.extend(page);
            if next.is_empty() {
                break;
            }
            token = next;
        }
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        // Size 0: everything at once; above the most: the most.
        let (page, next) = Pager::new("nodes", "", 0, 4, 64).unwrap().page(keys(10));
        assert_eq!((page.len(), next.as_str()), (10, ""));
        let (page, _) = Pager::new("nodes", "", 100, 4, 64).unwrap().page(keys(10));
        assert_eq!(page.len(), 4);
        // A token of another list, or none at all, is refused.
        let (_, next) = Pager::new("nodes", "", 1, 4, 64).unwrap().page(keys(3));
        assert!(Pager::new("queues", &next, 1, 4, 64).is_err());
        assert!(Pager::new("nodes", "%%%", 1, 4, 64).is_err());
    }
}
