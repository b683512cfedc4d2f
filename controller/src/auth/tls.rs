//! The controller's TLS: a rustls server configuration built from PEM files and rebuilt when
//! they change, and the listener's connections through it.
//!
//! Every new connection looks at the three files (one `stat` each); when one changed (its
//! modification time, size or inode, so an atomic rename or a Kubernetes secret update
//! counts), the configuration is rebuilt from them. A rebuild that fails (a file half written,
//! a key that doesn't match its certificate) is logged and the last good configuration stays,
//! so rotation never takes serving down. Open connections keep the certificate they began with.
//!
//! Client certificates are optional at the TLS layer, so clients of the scheduler service can
//! connect without one; when presented they must chain to the client CA, and the agent service
//! refuses callers without one (see [`super::identity`]).

use gpuwarden_runtime::sync::Lock as _;
use std::{
    io,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use gpuwarden_runtime::tls::{TlsFileError, read_certs, read_key};
use rustls::{RootCertStore, ServerConfig, server::WebPkiClientVerifier};
use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::transport::server::Connected;

use crate::limits::{Bounds, Refusal};

use super::{denials::DenialReason, followed::Stamp};

/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The controller's TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The serving certificate (chain), PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
    /// The CA that signs agents' (and clients') certificates, PEM.
    pub client_ca: PathBuf,
}

/// Why the TLS configuration can't be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A file can't be read or parsed.
    #[error(transparent)]
    File(#[from] TlsFileError),
    /// The client CA can't be used to verify clients.
    #[error("client CA {path}: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the certificate and key (e.g. they don't match).
    #[error("certificate {cert} with key {key}: {source}")]
    Certificate {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's words.
        #[source]
        source: rustls::Error,
    },
}

struct Loaded {
    stamps: [Option<Stamp>; 3],
    config: Arc<ServerConfig>,
}

/// A server configuration that follows its files.
pub struct ReloadingConfig {
    files: ServerTlsFiles,
    loaded: Mutex<Loaded>,
}

impl ReloadingConfig {
    /// Builds the configuration from `files` now.
    ///
    /// # Errors
    /// A file can't be read or used.
    pub fn load(files: ServerTlsFiles) -> Result<Self, TlsSetupError> {
        let stamps = stamps(&files);
        let config = Arc::new(build(&files)?);
        Ok(Self {
            files,
            loaded: Mutex::new(Loaded { stamps, config }),
        })
    }

    /// The configuration for a new connection: rebuilt first when a file changed, the last
    /// good one when that fails.
    pub fn current(&self) -> Arc<ServerConfig> {
        let now = stamps(&self.files);
        let mut loaded = self.loaded.locked();
        if now != loaded.stamps {
            match build(&self.files) {
                Ok(config) => {
                    tracing::info!(cert = %self.files.cert.display(), "TLS files changed: reloaded");
                    loaded.config = Arc::new(config);
                    loaded.stamps = now;
                }
                // Stamps stay old, so the next connection tries again.
                Err(e) => tracing::warn!(
                    "TLS files changed but can't be used, keeping the previous ones: {e}"
                ),
            }
        }
        Arc::clone(&loaded.config)
    }
}

fn stamps(files: &ServerTlsFiles) -> [Option<Stamp>; 3] {
    [&files.cert, &files.key, &files.client_ca].map(|p| Stamp::of(p))
}

/// The rustls configuration from the files: the serving certificate, and clients verified
/// against the client CA when they present a certificate.
///
/// # Errors
/// A file can't be read or used.
pub fn build(files: &ServerTlsFiles) -> Result<ServerConfig, TlsSetupError> {
    let chain = read_certs(&files.cert, "server certificate")?;
    let key = read_key(&files.key)?;
    let client_ca = |reason: String| TlsSetupError::ClientCa {
        path: files.client_ca.clone(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for ca in read_certs(&files.client_ca, "client CA certificate")? {
        roots.add(ca).map_err(|e| client_ca(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .allow_unauthenticated()
            .build()
            .map_err(|e| client_ca(e.to_string()))?;
    let certificate = |source| TlsSetupError::Certificate {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(certificate)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(certificate)?;
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A connection that holds one of the listener's permits until it closes.
pub struct Held<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Held<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Held<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Connected> Connected for Held<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The next connection on `listener` with a permit of `permits`; one over the cap is closed at
/// once and counted in `bounds` (`gpuwarden.limits.refused{reason=cap}`). `None` once `closed`
/// completes.
async fn accept_held(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    bounds: &Bounds,
    closed: impl std::future::Future<Output = ()>,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    tokio::pin!(closed);
    loop {
        let accepted = tokio::select! {
            () = &mut closed => return None,
            accepted = listener.accept() => accepted,
        };
        let (tcp, addr) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // gRPC answers in small frames (headers, a message, trailers): with Nagle's algorithm
        // on, a frame waits for the ACK of the one before, which the client may delay 40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%addr, "TCP_NODELAY: {e}");
        }
        if let Ok(permit) = Arc::clone(permits).try_acquire_owned() {
            return Some((tcp, addr, permit));
        }
        bounds.count(Refusal::Cap);
        tracing::debug!(%addr, "connection refused: the listener holds its cap");
    }
}

/// The listener's plain-text connections, each holding one of `permits` while open; those
/// refused at the cap are counted in `bounds`.
pub fn incoming_plain(
    listener: TcpListener,
    permits: Arc<Semaphore>,
    bounds: Arc<Bounds>,
) -> impl Stream<Item = io::Result<Held<TcpStream>>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some((tcp, _, permit)) =
            accept_held(&listener, &permits, &bounds, tx.closed()).await
        {
            if tx
                .send(Ok(Held {
                    io: tcp,
                    _permit: permit,
                }))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// How many connections a TLS listener holds, by stage: in their handshake, and established
/// with or without a client certificate. Anonymous peers (clients with tokens, probes, anyone)
/// can fill only their own pools, so connections that present a certificate (agents, clients
/// with certificates) always find room past the handshake. A connection refused at a cap is
/// counted in the server's [`Bounds`].
#[derive(Clone)]
pub struct ConnectionCaps {
    handshakes: Arc<Semaphore>,
    certified: Arc<Semaphore>,
    anonymous: Arc<Semaphore>,
    bounds: Arc<Bounds>,
}

impl ConnectionCaps {
    /// At most `handshakes` connections in their handshake, `certified` established with a
    /// client certificate and `anonymous` established without one; refusals counted in
    /// `bounds`.
    #[must_use]
    pub fn new(handshakes: usize, certified: usize, anonymous: usize, bounds: Arc<Bounds>) -> Self {
        Self {
            handshakes: Arc::new(Semaphore::new(handshakes)),
            certified: Arc::new(Semaphore::new(certified)),
            anonymous: Arc::new(Semaphore::new(anonymous)),
            bounds,
        }
    }

    /// The permit of an established connection, by whether its peer presented a certificate;
    /// `None` (counted) when that pool is full.
    fn established(&self, certified: bool, addr: SocketAddr) -> Option<OwnedSemaphorePermit> {
        let pool = if certified {
            &self.certified
        } else {
            &self.anonymous
        };
        let permit = Arc::clone(pool).try_acquire_owned().ok();
        if permit.is_none() {
            self.bounds.count(Refusal::Cap);
            tracing::debug!(
                %addr,
                certified,
                "connection closed after its handshake: the listener holds its cap"
            );
        }
        permit
    }
}

/// The listener's connections after their TLS handshake, for `serve_with_incoming`, each
/// holding a permit of `caps` from accept to close: one of the handshake pool until it is
/// done (so a flood of silent peers can't hold more than that), then one of the certified or
/// the anonymous pool.
/// Handshakes run concurrently, so a slow or silent client holds up no one; a failed one is
/// logged (and counted when it was refused for its client certificate) and dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ReloadingConfig>,
    caps: ConnectionCaps,
) -> impl Stream<Item = io::Result<Held<TlsStream<TcpStream>>>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some((tcp, addr, handshake)) =
            accept_held(&listener, &caps.handshakes, &caps.bounds, tx.closed()).await
        {
            let tls = Arc::clone(&tls);
            let tx = tx.clone();
            let caps = caps.clone();
            tokio::spawn(async move {
                let acceptor = TlsAcceptor::from(tls.current());
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        drop(handshake);
                        let certified = stream.get_ref().1.peer_certificates().is_some();
                        let Some(permit) = caps.established(certified, addr) else {
                            return;
                        };
                        let _ = tx
                            .send(Ok(Held {
                                io: stream,
                                _permit: permit,
                            }))
                            .await;
                    }
                    Ok(Err(e)) => handshake_failed(&caps.bounds, addr, &e),
                    Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Logs a failed handshake; one refused for its client certificate is counted in `bounds`.
fn handshake_failed(bounds: &Bounds, addr: SocketAddr, e: &io::Error) {
    let rustls_error = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    if let Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented) =
        rustls_error
    {
        bounds.denials().refuse(
            DenialReason::BadClientCertificate,
            &addr.to_string(),
            &format_args!("TLS handshake refused: {e}"),
        );
    } else {
        // Probes and plain-text clients on the TLS port: not worth a warning each.
        tracing::debug!(%addr, "TLS handshake failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt as _;

    use crate::limits::Limits;

    use super::*;

    /// A TLS client trusting the minted CA, with the certificate `identity` names, if any.
    async fn connect(
        addr: SocketAddr,
        dir: &std::path::Path,
        identity: Option<&str>,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let mut roots = RootCertStore::empty();
        for cert in read_certs(&dir.join(super::super::mint::CA_CERT), "CA").unwrap() {
            roots.add(cert).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some(name) => builder
                .with_client_auth_cert(
                    read_certs(&dir.join(format!("{name}.pem")), "certificate").unwrap(),
                    read_key(&dir.join(format!("{name}.key"))).unwrap(),
                )
                .unwrap(),
        };
        let tcp = TcpStream::connect(addr).await?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(
                rustls_pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
    }

    /// Whether the server closes `stream` (a read ends) within a generous deadline.
    async fn closed(mut stream: tokio_rustls::client::TlsStream<TcpStream>) -> bool {
        use tokio::io::AsyncReadExt as _;
        let mut byte = [0_u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(30), stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn anonymous_connections_cannot_take_the_room_of_certified_ones() {
        let dir = tempfile::tempdir().unwrap();
        super::super::mint::mint_into(dir.path(), &["node-1".into()], &["localhost".into()], 1)
            .unwrap();
        let tls = Arc::new(ReloadingConfig::load(ServerTlsFiles::minted(dir.path())).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = Box::pin(incoming(
            listener,
            tls,
            ConnectionCaps::new(8, 2, 1, Bounds::new(Limits::default())),
        ));

        let first = connect(addr, dir.path(), None).await.unwrap();
        let held = accepted.next().await.unwrap().unwrap();
        // The anonymous pool (1) is full: a second anonymous peer is closed after its handshake.
        let second = connect(addr, dir.path(), None).await.unwrap();
        assert!(
            closed(second).await,
            "a second anonymous connection was kept"
        );
        // A node still gets in.
        let _node = connect(addr, dir.path(), Some("node-1")).await.unwrap();
        let node = accepted.next().await.unwrap().unwrap();
        assert!(node.io.get_ref().1.peer_certificates().is_some());
        // Room comes back when the anonymous one closes.
        drop((first, held));
        let again = connect(addr, dir.path(), None).await.unwrap();
        let kept = tokio::time::timeout(Duration::from_secs(30), accepted.next()).await;
        assert!(matches!(kept, Ok(Some(Ok(_)))), "no room came back");
        drop(again);
    }
}
