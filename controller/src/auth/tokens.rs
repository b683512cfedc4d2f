//! Bearer tokens for scheduler clients: a file of hashed tokens, each mapped to an owner and a
//! role, re-read when it changes.
//!
//! The file is TOML, one `[[tokens]]` table per token:
//!
//! ```toml
//! [[tokens]]
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! owner = "alice"
//! role = "user"      # or "admin"
//! ```
//!
//! Only the SHA-256 of a token (64 hex digits) is stored, so the file is no secret worth
//! stealing; a token is random (256 bits), so a plain hash is enough. `gpuwarden-controller
//! tokens add` generates one, prints it once and appends its entry; by hand,
//! `printf %s "$TOKEN" | sha256sum` gives the hash. Removing an entry revokes its token.
//!
//! Like the TLS files, the file is followed (`followed`): looked at on each call and
//! parsed again when it changed. It fails closed: a deleted file revokes every token, and a
//! version that can't be parsed (half written, a typo) keeps only the tokens of the last good
//! version whose hash is still written in it, so an edit that removes a token revokes it
//! whatever else is wrong with the file; the failure is logged and counted.

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::Deserialize;

use super::{
    followed::{ConfigFile, Followed},
    principal::{ClientRole, check_name},
};

/// What a generated token starts with, so it is recognisable in a secret scanner.
pub const TOKEN_PREFIX: &str = "gwt_";

/// Why the token file can't be used or written.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file can't be read or written.
    #[error("token file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("token file {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's words, with line and column.
        reason: String,
    },
    /// An entry is unusable.
    #[error("token file {path}, entry {index}: {reason}")]
    Entry {
        /// The file.
        path: PathBuf,
        /// Which `[[tokens]]` table, from 1.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// An owner that can't be used.
    #[error("owner {owner:?}: {reason}")]
    InvalidOwner {
        /// The owner given.
        owner: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The system's random source failed.
    #[error("cannot generate a random token")]
    Random,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    #[serde(default)]
    tokens: Vec<RawEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    sha256: String,
    owner: String,
    role: ClientRole,
}

/// Who a token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry {
    /// The owner it acts as.
    pub owner: String,
    /// What it may do.
    pub role: ClientRole,
}

/// The tokens of one version of the file, by hash.
#[derive(Debug, Default)]
pub struct Tokens {
    by_hash: HashMap<[u8; 32], TokenEntry>,
}

impl Tokens {
    /// Parses a token file's text (`path` names it in errors).
    ///
    /// # Errors
    /// Not TOML of the expected shape, a hash that is not 64 hex digits, an invalid owner, or
    /// the same hash twice.
    pub fn parse(text: &str, path: &Path) -> Result<Self, TokenError> {
        let file: FileFormat = toml::from_str(text).map_err(|e| TokenError::Parse {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let mut by_hash = HashMap::with_capacity(file.tokens.len());
        for (i, raw) in file.tokens.into_iter().enumerate() {
            let entry = |reason: String| TokenError::Entry {
                path: path.to_owned(),
                index: i + 1,
                reason,
            };
            let hash = parse_hash(&raw.sha256).ok_or_else(|| {
                entry("sha256 must be 64 hex digits (the SHA-256 of the token)".to_owned())
            })?;
            check_name(&raw.owner).map_err(|reason| entry(format!("owner: {reason}")))?;
            let new = TokenEntry {
                owner: raw.owner,
                role: raw.role,
            };
            if by_hash.insert(hash, new).is_some() {
                return Err(entry("the same sha256 as an earlier entry".to_owned()));
            }
        }
        Ok(Self { by_hash })
    }

    /// Who `token` stands for, if anyone.
    #[must_use]
    pub fn get(&self, token: &str) -> Option<&TokenEntry> {
        self.by_hash.get(&sha256(token))
    }

    /// How many tokens there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// The token file, followed as it changes.
pub struct TokenFile(Followed<Tokens, TokenError>);

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.0.path())
            .finish_non_exhaustive()
    }
}

impl TokenFile {
    /// Reads `path` now.
    ///
    /// # Errors
    /// The file can't be read or parsed.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        Followed::load(path, ConfigFile::Tokens, read, salvage).map(Self)
    }

    /// The file.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The tokens now: read again first when the file changed; when that fails, those of the
    /// last good version whose hash the new text still holds (none when the file is gone).
    pub fn current(&self) -> Arc<Tokens> {
        self.0.current()
    }

    /// Versions of the file that changed and could not be used since it was loaded
    /// (`gpuwarden.controller.config.unusable{gpuwarden.config.file="token_file"}`).
    #[must_use]
    pub fn unusable(&self) -> u64 {
        self.0.unusable()
    }

    /// Who `token` stands for in the current file.
    #[must_use]
    pub fn lookup(&self, token: &str) -> Option<TokenEntry> {
        self.current().get(token).cloned()
    }
}

fn read(path: &Path) -> Result<Tokens, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Io {
        path: path.to_owned(),
        source,
    })?;
    Tokens::parse(&text, path)
}

/// The tokens of `last` whose hash `text` (an unusable new version) still holds: a removed
/// entry is revoked even when the edit broke the file elsewhere; no text, no tokens.
fn salvage(last: &Tokens, text: Option<&str>) -> Tokens {
    let Some(text) = text else {
        return Tokens::default();
    };
    let text = text.to_ascii_lowercase();
    let by_hash = last
        .by_hash
        .iter()
        .filter(|(hash, _)| text.contains(&hex(hash.as_slice())))
        .map(|(hash, entry)| (*hash, entry.clone()))
        .collect();
    Tokens { by_hash }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn sha256(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The SHA-256 of `token`, lowercase hex, as the file holds it.
#[must_use]
pub fn hash_hex(token: &str) -> String {
    hex(&sha256(token))
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let digit = |c: u8| char::from(c).to_digit(16);
    let mut out = [0; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let value = digit(pair[0])? * 16 + digit(pair[1])?;
        *byte = u8::try_from(value).ok()?;
    }
    Some(out)
}

/// A new random token: [`TOKEN_PREFIX`] and 256 random bits in hex.
///
/// # Errors
/// The system's random source failed.
pub fn generate() -> Result<String, TokenError> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| TokenError::Random)?;
    Ok(bytes.iter().fold(TOKEN_PREFIX.to_owned(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }))
}

/// Generates a token for `owner` in `role`, appends its entry to `path` (made, readable by its
/// owner only, when absent) and returns the token: the only time it is seen.
///
/// # Errors
/// The owner can't be used, the file as it is can't be parsed (nothing is appended to a broken
/// file), or it can't be written.
pub fn add(path: &Path, owner: &str, role: ClientRole) -> Result<String, TokenError> {
    check_name(owner).map_err(|reason| TokenError::InvalidOwner {
        owner: owner.to_owned(),
        reason,
    })?;
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(TokenError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    Tokens::parse(&existing, path)?;
    let token = generate()?;
    let separator = if existing.is_empty() || existing.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    // `check_name` keeps the owner free of quotes and escapes, so it goes in as it is.
    let entry = format!(
        "{separator}\n[[tokens]]\nsha256 = \"{}\"\nowner = \"{owner}\"\nrole = \"{role}\"\n",
        hash_hex(&token)
    );
    let io = |source| TokenError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(entry.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_sha256_hex() {
        // printf %s test | sha256sum
        assert_eq!(
            hash_hex("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        assert_eq!(parse_hash(&hash_hex("test")), Some(sha256("test")));
        assert_eq!(parse_hash(&"g".repeat(64)), None);
        assert_eq!(parse_hash("abc"), None);
    }

    #[test]
    fn generated_tokens_are_long_and_differ() {
        let (a, b) = (generate().unwrap(), generate().unwrap());
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 64);
    }

    #[test]
    fn entries_map_tokens_to_owners_and_roles() {
        let text = format!(
            "[[tokens]]\nsha256 = \"{}\"\nowner = \"alice\"\nrole = \"user\"\n\
             [[tokens]]\nsha256 = \"{}\"\nowner = \"ops\"\nrole = \"admin\"\n",
            hash_hex("a-token"),
            hash_hex("o-token").to_uppercase()
        );
        let tokens = Tokens::parse(&text, Path::new("t.toml")).unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(
            tokens.get("a-token"),
            Some(&TokenEntry {
                owner: "alice".into(),
                role: ClientRole::User
            })
        );
        assert_eq!(
            tokens.get("o-token").map(|e| e.role),
            Some(ClientRole::Admin)
        );
        assert_eq!(tokens.get("x-token"), None);
    }

    #[test]
    fn bad_entries_are_named() {
        for (text, needle) in [
            (
                "[[tokens]]\nsha256 = \"abc\"\nowner = \"a\"\nrole = \"user\"\n".to_owned(),
                "entry 1: sha256",
            ),
            (
                format!(
                    "[[tokens]]\nsha256 = \"{}\"\nowner = \"a b\"\nrole = \"user\"\n",
                    hash_hex("x")
                ),
                "entry 1: owner",
            ),
            (
                format!(
                    "[[tokens]]\nsha256 = \"{}\"\nowner = \"a\"\nrole = \"root\"\n",
                    hash_hex("x")
                ),
                "role",
            ),
            (
                format!(
                    "[[tokens]]\nsha256 = \"{h}\"\nowner = \"a\"\nrole = \"user\"\n\
                     [[tokens]]\nsha256 = \"{h}\"\nowner = \"b\"\nrole = \"admin\"\n",
                    h = hash_hex("x")
                ),
                "entry 2: the same sha256",
            ),
        ] {
            let err = Tokens::parse(&text, Path::new("t.toml")).unwrap_err();
            assert!(err.to_string().contains(needle), "{err}");
        }
        assert!(Tokens::parse("", Path::new("t.toml")).unwrap().is_empty());
    }

    #[test]
    fn add_appends_and_the_file_follows_changes() {
        use std::os::unix::fs::PermissionsExt as _;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let alice = add(&path, "alice", ClientRole::User).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let file = TokenFile::load(&path).unwrap();
        assert_eq!(file.lookup(&alice).map(|e| e.owner), Some("alice".into()));

        let ops = add(&path, "ops", ClientRole::Admin).unwrap();
        assert_eq!(file.lookup(&ops).map(|e| e.role), Some(ClientRole::Admin));
        assert!(file.lookup(&alice).is_some());

        // A broken version keeps only the tokens whose hash it still holds: alice's entry is
        // gone, ops's is there beside a typo.
        assert_eq!(file.unusable(), 0);
        std::fs::write(
            &path,
            format!(
                "[[tokens]\nsha256 = \"{}\"\nowner = \"ops\"\nrole = \"admin\"\n[[tokens]\n",
                hash_hex(&ops)
            ),
        )
        .unwrap();
        assert!(file.lookup(&ops).is_some());
        assert!(file.lookup(&alice).is_none());
        assert_eq!(file.unusable(), 1, "the broken version is counted once");
        assert!(matches!(
            add(&path, "bob", ClientRole::User),
            Err(TokenError::Parse { .. })
        ));
        // Emptied: every token is revoked.
        std::fs::write(&path, "").unwrap();
        assert!(file.lookup(&ops).is_none());
        // Deleted: every token is revoked too, and stays so.
        let ops = add(&path, "ops", ClientRole::Admin).unwrap();
        assert!(file.lookup(&ops).is_some());
        assert_eq!(file.unusable(), 1, "an empty file is a usable one");
        std::fs::remove_file(&path).unwrap();
        assert!(file.lookup(&ops).is_none());
        assert!(file.lookup(&ops).is_none());
        assert_eq!(file.unusable(), 2, "the deletion is counted once");

        assert!(matches!(
            add(&path, "../x", ClientRole::User),
            Err(TokenError::InvalidOwner { .. })
        ));
    }
}
