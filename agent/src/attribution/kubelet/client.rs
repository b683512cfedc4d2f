//! A one-request-at-a-time HTTP/1 client for the kubelet's pod list, over TCP or TLS.

use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
use tokio::io::{AsyncRead, AsyncWrite};

use super::{KubeletConfig, KubeletError, PodName, parse_pod_list};

/// Largest pod list read (a node's 110 pods are a few MB at most).
const MAX_BODY: usize = 64 << 20;

/// One request's time limit, connect to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One-request-at-a-time HTTP/1 client for the pod list.
pub(super) struct Client {
    uri: http::Uri,
    host: String,
    port: u16,
    pub(super) tls: Option<tokio_rustls::TlsConnector>,
    token_file: Option<PathBuf>,
}

impl Client {
    pub(super) fn new(config: &KubeletConfig) -> Result<Self, KubeletError> {
        let bad = |reason: &str| KubeletError::Url {
            url: config.url.clone(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = config.url.parse().map_err(|e| bad(&format!("{e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("the scheme must be http or https")),
        };
        let host = uri
            .host()
            .ok_or_else(|| bad("no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = https.then(|| tls_connector(config)).transpose()?;
        Ok(Self {
            uri,
            host,
            port,
            tls,
            token_file: config.token_file.clone(),
        })
    }

    pub(super) async fn pods(&self) -> Result<HashMap<String, PodName>, KubeletError> {
        let body = tokio::time::timeout(REQUEST_TIMEOUT, self.get())
            .await
            .map_err(|_| KubeletError::Timeout(REQUEST_TIMEOUT))??;
        parse_pod_list(&body)
    }

    async fn get(&self) -> Result<Bytes, KubeletError> {
        let mut request = http::Request::get(
            self.uri
                .path_and_query()
                .map_or("/", http::uri::PathAndQuery::as_str),
        )
        .header(http::header::HOST, self.authority())
        .header(http::header::ACCEPT, "application/json");
        if let Some(path) = &self.token_file {
            let token = std::fs::read_to_string(path).map_err(|source| KubeletError::Token {
                path: path.clone(),
                source,
            })?;
            request = request.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            );
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| KubeletError::Body(e.to_string()))?;
        let addr = format!("{}:{}", self.host, self.port);
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| KubeletError::Connect { addr, source })?;
        match &self.tls {
            Some(tls) => {
                let name =
                    ServerName::try_from(self.host.clone()).map_err(|e| KubeletError::Url {
                        url: self.uri.to_string(),
                        reason: e.to_string(),
                    })?;
                let stream = tls.connect(name, tcp).await.map_err(KubeletError::Tls)?;
                exchange(stream, request).await
            }
            None => exchange(tcp, request).await,
        }
    }

    fn authority(&self) -> String {
        match self.uri.authority() {
            Some(a) => a.as_str().to_owned(),
            None => self.host.clone(),
        }
    }
}

/// Sends `request` over `io` and reads the whole answer, mapping statuses to errors.
async fn exchange<S>(io: S, request: http::Request<Empty<Bytes>>) -> Result<Bytes, KubeletError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(KubeletError::Http)?;
    // The connection is driven by its own task; it ends with the exchange (one request).
    let driver = tokio::spawn(connection);
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(KubeletError::Http)?;
        match response.status().as_u16() {
            200 => {}
            401 => return Err(KubeletError::Unauthorized),
            403 => return Err(KubeletError::Forbidden),
            status => return Err(KubeletError::Status { status }),
        }
        Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .map_err(|e| KubeletError::Body(e.to_string()))
    }
    .await;
    driver.abort();
    result
}

/// TLS with the CA file's roots, or with no verification when asked.
fn tls_connector(config: &KubeletConfig) -> Result<tokio_rustls::TlsConnector, KubeletError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(KubeletError::TlsConfig)?;
    let tls = if config.insecure_skip_tls_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth()
    } else {
        let path = config.ca_file.as_ref().ok_or(KubeletError::NoCa)?;
        let ca_err = |reason: String| KubeletError::CaFile {
            path: path.clone(),
            reason,
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| ca_err(e.to_string()))? {
            let cert = cert.map_err(|e| ca_err(e.to_string()))?;
            roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(ca_err("no certificate in it".to_owned()));
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(tls)))
}

/// Accepts any server certificate (still checking the handshake's signatures): for kubelets
/// with self-signed serving certificates, when the operator asks for it.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
