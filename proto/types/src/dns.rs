//! The DNS names Kubernetes gives its objects (RFC 1123), checked before they name a URL path,
//! a file or a key.

/// Whether `s` is a DNS label (a namespace): 1 to 63 lowercase letters, digits or `-`, not
/// starting or ending with `-`.
#[must_use]
pub fn is_dns_label(s: &str) -> bool {
    is_name(s, 63, false)
}

/// Whether `s` is a DNS subdomain (most object names): 1 to 253 lowercase letters, digits, `-`
/// or `.`, starting and ending with a letter or digit.
#[must_use]
pub fn is_dns_subdomain(s: &str) -> bool {
    is_name(s, 253, true)
}

fn is_name(s: &str, max: usize, dots: bool) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
        })
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains_follow_rfc_1123() {
        for ok in ["ml", "team-a", "a1", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Team",
            "a.b",
            "a_b",
            "../x",
            &"a".repeat(64),
        ] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        for ok in ["train-0.gpu", "a", &"a".repeat(253)] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", ".a", "a.", "a/b", "A", &"a".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
