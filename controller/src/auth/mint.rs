//! Certificates for a small cluster without OpenSSL: a CA, the controller's serving
//! certificate, one client certificate per node that names it the way [`super::identity`]
//! reads it (`spiffe://gpuwarden/node/<node-id>`), and client certificates for users and admins
//! of the scheduler service as [`super::clients`] reads them
//! (`spiffe://gpuwarden/user/<name>`, `spiffe://gpuwarden/admin/<name>`).
//!
//! `gpuwarden-controller certs mint` writes them into a directory; run again on the same
//! directory it reuses the CA there (one this module minted) and replaces the other files
//! atomically, which is how certificates are rotated or a node is added. Keys are ECDSA P-256,
//! written readable by the owner only. Larger clusters use their own PKI (cert-manager).

use std::{
    fmt::Write as _,
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use super::{
    principal::{ClientRole, check_name, node_uri},
    tls::ServerTlsFiles,
};

/// The CA certificate's file name in a minted directory.
pub const CA_CERT: &str = "ca.pem";
/// The CA key's file name.
pub const CA_KEY: &str = "ca.key";
/// The controller's serving certificate's file name.
pub const SERVER_CERT: &str = "server.pem";
/// Its key's file name.
pub const SERVER_KEY: &str = "server.key";

/// Why certificates can't be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// A node id that can't name a certificate (or its file).
    #[error("node id {id:?}: {reason}")]
    InvalidNodeId {
        /// The id given.
        id: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A client name that can't name a certificate (or its file).
    #[error("client name {name:?}: {reason}")]
    InvalidClientName {
        /// The name given.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Only one of `ca.pem` and `ca.key` is in the directory.
    #[error(
        "{present} is there without its other half ({CA_CERT}, {CA_KEY}): refusing to mint a \
         new CA over it; restore the missing file or move this one away"
    )]
    HalfCa {
        /// The file that is there.
        present: PathBuf,
    },
    /// The output folder is writable by others than its owner: one of them could plant or swap
    /// files there (a key among them).
    #[error(
        "{path} is writable by its group or by everyone (mode {mode:o}): keys are not minted \
         where others may create files; use a folder only its owner can write (chmod go-w)"
    )]
    SharedFolder {
        /// The folder.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The system's random source failed (naming a temporary file).
    #[error("cannot draw a random name for a temporary file")]
    Random,
    /// rcgen refused (a server name that is neither a DNS name nor an IP address …).
    #[error("minting the {what}: {source}")]
    Rcgen {
        /// Which certificate.
        what: String,
        /// rcgen's words.
        #[source]
        source: rcgen::Error,
    },
    /// A file can't be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Minted {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// A certificate authority that signs the controller's and the nodes' certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

/// The CA's fixed parameters: reusing a CA rebuilds its issuer from these and its key.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "gpuwarden");
    params
        .distinguished_name
        .push(DnType::CommonName, "gpuwarden CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// From a few minutes ago (clock skew between machines) for `days`.
fn validity(params: &mut CertificateParams, days: u32) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(i64::from(days));
}

fn rcgen_error(what: &str) -> impl FnOnce(rcgen::Error) -> MintError + '_ {
    move |source| MintError::Rcgen {
        what: what.to_owned(),
        source,
    }
}

impl Ca {
    /// A new CA valid for `days`.
    ///
    /// # Errors
    /// rcgen fails.
    pub fn new(days: u32) -> Result<Self, MintError> {
        let key = KeyPair::generate().map_err(rcgen_error("CA key"))?;
        let mut params = ca_params();
        validity(&mut params, days);
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_error("CA certificate"))?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
        })
    }

    /// A CA this module minted before, from its certificate and key.
    ///
    /// # Errors
    /// The key can't be parsed.
    pub fn reuse(cert_pem: String, key_pem: &str) -> Result<Self, MintError> {
        let key = KeyPair::from_pem(key_pem).map_err(rcgen_error("CA key"))?;
        Ok(Self {
            issuer: Issuer::new(ca_params(), key),
            cert_pem,
        })
    }

    /// The CA certificate, PEM: what agents and clients trust, and the controller's client CA.
    #[must_use]
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA key, PEM: keep it off the cluster's machines.
    #[must_use]
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// The controller's serving certificate for `names` (DNS names or IP addresses).
    ///
    /// # Errors
    /// A name is neither, or rcgen fails.
    pub fn server(&self, names: &[String], days: u32) -> Result<Minted, MintError> {
        let mut params =
            CertificateParams::new(names.to_vec()).map_err(rcgen_error("server certificate"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, "gpuwarden-controller");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, days, "server certificate")
    }

    /// A certificate for a service whose members are both servers and clients of each other,
    /// such as etcd with `--client-cert-auth` (its gateway dials its own port): `names` (DNS
    /// names or IP addresses), for server and client authentication.
    ///
    /// # Errors
    /// A name is neither, or rcgen fails.
    pub fn peer(&self, names: &[String], days: u32) -> Result<Minted, MintError> {
        let mut params =
            CertificateParams::new(names.to_vec()).map_err(rcgen_error("peer certificate"))?;
        params.distinguished_name.push(DnType::CommonName, "peer");
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.sign(params, days, "peer certificate")
    }

    /// A node's client certificate, naming it.
    ///
    /// # Errors
    /// The node id can't be used, or rcgen fails.
    pub fn node(&self, node_id: &str, days: u32) -> Result<Minted, MintError> {
        check_node_id(node_id)?;
        let what = format!("certificate of node {node_id}");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, node_id);
        let uri = node_uri(node_id).try_into().map_err(rcgen_error(&what))?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, days, &what)
    }

    /// A scheduler client's certificate, naming `name` in `role`
    /// (`spiffe://gpuwarden/user/<name>` or `spiffe://gpuwarden/admin/<name>`).
    ///
    /// # Errors
    /// The name can't be used, or rcgen fails.
    pub fn client(&self, name: &str, role: ClientRole, days: u32) -> Result<Minted, MintError> {
        check_name(name).map_err(|reason| MintError::InvalidClientName {
            name: name.to_owned(),
            reason,
        })?;
        let what = format!("certificate of {role} {name}");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        let uri = role.uri(name).try_into().map_err(rcgen_error(&what))?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, days, &what)
    }

    fn sign(
        &self,
        mut params: CertificateParams,
        days: u32,
        what: &str,
    ) -> Result<Minted, MintError> {
        validity(&mut params, days);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(rcgen_error(what))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_error(what))?;
        Ok(Minted {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A node id that is safe as a file name and in a URI: letters, digits, `.`, `-`, `_`, not
/// starting with `.` or `-` (Kubernetes node names fit).
///
/// # Errors
/// [`MintError::InvalidNodeId`].
pub fn check_node_id(id: &str) -> Result<(), MintError> {
    let invalid = |reason| {
        Err(MintError::InvalidNodeId {
            id: id.to_owned(),
            reason,
        })
    };
    if id.is_empty() || id.len() > 253 {
        return invalid("must be 1 to 253 characters");
    }
    if id.starts_with(['.', '-']) {
        return invalid("must not start with '.' or '-'");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return invalid("only letters, digits, '.', '-' and '_'");
    }
    Ok(())
}

/// Node ids whose files (`<node>.pem`, `<node>.key`) would replace the CA's, the server's or a
/// client's in a minted directory: `ca` and `server`, and `user-…`/`admin-…` (any case, for
/// file systems that fold it).
///
/// # Errors
/// [`MintError::InvalidNodeId`] naming the file it would replace.
fn check_node_file(id: &str) -> Result<(), MintError> {
    let lower = id.to_ascii_lowercase();
    let stem = |file: &str| {
        file.rsplit_once('.')
            .map_or(file, |(stem, _)| stem)
            .to_owned()
    };
    let reserved = [
        stem(CA_CERT),
        stem(CA_KEY),
        stem(SERVER_CERT),
        stem(SERVER_KEY),
    ];
    let collides = reserved.contains(&lower)
        || [ClientRole::Admin, ClientRole::User]
            .iter()
            .any(|role| lower.starts_with(&format!("{role}-")));
    if collides {
        return Err(MintError::InvalidNodeId {
            id: id.to_owned(),
            reason: "its files would replace the CA's, the server's or a client's in this \
                     directory (ca, server, user-*, admin-* are reserved)",
        });
    }
    Ok(())
}

/// What [`mint_into`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintedFiles {
    /// Whether the directory's CA was reused.
    pub reused_ca: bool,
    /// Every file written.
    pub written: Vec<PathBuf>,
}

/// Mints into `out`: the CA (`ca.pem`, `ca.key`; reused when both are there), the serving
/// certificate for `server_names` (`server.pem`, `server.key`), and `<node>.pem`/`<node>.key`
/// per node. Leaf certificates are valid for `days`, a new CA for ten times as long.
///
/// # Errors
/// A node id or server name can't be used, or a file can't be read or written.
pub fn mint_into(
    out: &Path,
    nodes: &[String],
    server_names: &[String],
    days: u32,
) -> Result<MintedFiles, MintError> {
    for node in nodes {
        check_node_id(node)?;
        check_node_file(node)?;
    }
    let mut written = Vec::new();
    let (ca, reused_ca) = ca_in(out, days, &mut written)?;
    if !server_names.is_empty() {
        let server = ca.server(server_names, days)?;
        write(&out.join(SERVER_KEY), &server.key_pem, &mut written)?;
        write(&out.join(SERVER_CERT), &server.cert_pem, &mut written)?;
    }
    for node in nodes {
        let minted = ca.node(node, days)?;
        write(
            &out.join(format!("{node}.key")),
            &minted.key_pem,
            &mut written,
        )?;
        write(
            &out.join(format!("{node}.pem")),
            &minted.cert_pem,
            &mut written,
        )?;
    }
    Ok(MintedFiles { reused_ca, written })
}

/// The CA in `out` (reused when `ca.pem` and `ca.key` are there, else minted for ten times
/// `days` and written), and whether it was reused.
fn ca_in(out: &Path, days: u32, written: &mut Vec<PathBuf>) -> Result<(Ca, bool), MintError> {
    private_folder(out)?;
    let (ca_cert, ca_key) = (out.join(CA_CERT), out.join(CA_KEY));
    match (ca_cert.exists(), ca_key.exists()) {
        (true, true) => return Ok((Ca::reuse(read(&ca_cert)?, &read(&ca_key)?)?, true)),
        // Half a CA: minting a new one would replace the other half, and a CA key is never
        // overwritten.
        (true, false) | (false, true) => {
            return Err(MintError::HalfCa {
                present: if ca_key.exists() { ca_key } else { ca_cert },
            });
        }
        (false, false) => {}
    }
    let ca = Ca::new(days.saturating_mul(10))?;
    write(&ca_key, &ca.key_pem(), written)?;
    write(&ca_cert, ca.cert_pem(), written)?;
    Ok((ca, false))
}

/// Mints scheduler clients' certificates into `out` with its CA (reused, or minted as
/// [`mint_into`] does): `<role>-<name>.pem` and `<role>-<name>.key` per client, valid for `days`.
///
/// # Errors
/// A name can't be used, or a file can't be read or written.
pub fn mint_clients_into(
    out: &Path,
    clients: &[(String, ClientRole)],
    days: u32,
) -> Result<MintedFiles, MintError> {
    for (name, _) in clients {
        check_name(name).map_err(|reason| MintError::InvalidClientName {
            name: name.clone(),
            reason,
        })?;
    }
    let mut written = Vec::new();
    let (ca, reused_ca) = ca_in(out, days, &mut written)?;
    for (name, role) in clients {
        let minted = ca.client(name, *role, days)?;
        write(
            &out.join(format!("{role}-{name}.key")),
            &minted.key_pem,
            &mut written,
        )?;
        write(
            &out.join(format!("{role}-{name}.pem")),
            &minted.cert_pem,
            &mut written,
        )?;
    }
    Ok(MintedFiles { reused_ca, written })
}

/// Makes `out` (owner only) when it is not there, and refuses one that others may write into:
/// there they could plant a file or a link where a key is about to be written (issue 33).
fn private_folder(out: &Path) -> Result<(), MintError> {
    let io = |source| MintError::Io {
        path: out.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(out)
        .map_err(io)?;
    let mode = std::fs::metadata(out).map_err(io)?.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(MintError::SharedFolder {
            path: out.to_owned(),
            mode,
        });
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, MintError> {
    std::fs::read_to_string(path).map_err(|source| MintError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Writes through a temporary file and a rename, so a reader never sees half a file; owner
/// read/write only (keys among them). The temporary file has a random name and is created
/// new (`O_EXCL`), never through a link (`O_NOFOLLOW`), and its mode is set on the open file
/// (`fchmod`), whatever the umask: nobody can have made it first and kept a handle on the key.
fn write(path: &Path, contents: &str, written: &mut Vec<PathBuf>) -> Result<(), MintError> {
    use ring::rand::SecureRandom as _;

    let io = |source| MintError::Io {
        path: path.to_owned(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut random = [0u8; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut random)
        .map_err(|_| MintError::Random)?;
    let suffix = random.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    let tmp = path.with_file_name(format!(".{name}.{suffix}.tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    let written_out = file
        .set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| file.write_all(contents.as_bytes()))
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written_out {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    written.push(path.to_owned());
    Ok(())
}

/// The files this module writes, as the server reads them.
impl ServerTlsFiles {
    /// The files `certs mint` writes into `dir`: the serving certificate and key, and its CA as
    /// the client CA.
    #[must_use]
    pub fn minted(dir: &Path) -> Self {
        Self {
            cert: dir.join(SERVER_CERT),
            key: dir.join(SERVER_KEY),
            client_ca: dir.join(CA_CERT),
        }
    }
}

#[cfg(test)]
mod tests;
