use gpuwarden_kube::KubeError;

use super::*;
use crate::attribution::kubelet::default_url;

const UID: &str = "0b3c2f0e-5a8c-4d4e-9f6e-1f2a3b4c5d6e";

#[test]
fn urls_are_checked_and_the_default_brackets_ipv6() {
    assert_eq!(default_url("10.0.0.5"), "https://10.0.0.5:10250/pods");
    assert_eq!(default_url("fd00::5"), "https://[fd00::5]:10250/pods");
    let c = Client::new(&KubeletConfig::plain("http://[::1]:8080/pods")).unwrap();
    assert_eq!((c.0.url_path(), c.0.is_tls()), ("/pods", false));
    for bad in ["ftp://x/pods", "/pods", "http://"] {
        let err = Client::new(&KubeletConfig::plain(bad)).err().unwrap();
        assert_eq!(err.label(), "config", "{bad}: {err}");
    }
    // https needs a CA or an explicit opt-out.
    let err = Client::new(&KubeletConfig::plain("https://10.0.0.5:10250/pods"))
        .err()
        .unwrap();
    assert!(
        matches!(err, KubeletError::Request(KubeError::NoCa { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("kubelet_ca_file"), "{err}");
    let mut insecure = KubeletConfig::plain("https://10.0.0.5:10250/pods");
    insecure.insecure_skip_tls_verify = true;
    assert!(Client::new(&insecure).unwrap().0.is_tls());
}

#[test]
fn a_ca_file_without_certificates_is_refused() {
    let dir = gpuwarden_test_support::scratch("kubelet-ca");
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, "not a certificate\n").unwrap();
    let mut config = KubeletConfig::plain("https://10.0.0.5:10250/pods");
    config.ca_file = Some(path.clone());
    let err = Client::new(&config).err().unwrap();
    assert!(
        matches!(err, KubeletError::Request(KubeError::CaFile { .. })),
        "{err}"
    );
}

/// A one-shot HTTP server on loopback answering `status` and `body`; returns the URL and
/// the request it received.
fn serve_once(status: &str, body: &str) -> (String, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/pods", listener.local_addr().unwrap());
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let thread = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut request = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                break;
            }
            request.push_str(&line);
        }
        (&stream).write_all(response.as_bytes()).unwrap();
        request
    });
    (url, thread)
}

#[tokio::test]
async fn fetches_with_the_token_and_maps_statuses() {
    let dir = gpuwarden_test_support::scratch("kubelet-token");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let list =
        format!(r#"{{"items":[{{"metadata":{{"name":"a","namespace":"b","uid":"{UID}"}}}}]}}"#);
    let (url, server) = serve_once("200 OK", &list);
    let mut config = KubeletConfig::plain(&url);
    config.token_file = Some(token.clone());
    let pods = Client::new(&config).unwrap().pods().await.unwrap();
    assert_eq!(pods[UID].namespace, "b");
    let request = server.join().unwrap();
    assert!(request.starts_with("GET /pods HTTP/1.1"), "{request}");
    assert!(
        request.contains("authorization: Bearer s3cret\r\n"),
        "{request}"
    );

    for (status, label) in [
        ("401 Unauthorized", "unauthorized"),
        ("403 Forbidden", "forbidden"),
        ("500 Internal Server Error", "http_error"),
    ] {
        let (url, server) = serve_once(status, "{}");
        let err = Client::new(&KubeletConfig::plain(&url))
            .unwrap()
            .pods()
            .await
            .unwrap_err();
        assert_eq!(err.label(), label, "{status}: {err}");
        server.join().unwrap();
    }
    let (url, server) = serve_once("200 OK", "[1,2");
    let err = Client::new(&KubeletConfig::plain(&url))
        .unwrap()
        .pods()
        .await
        .unwrap_err();
    assert_eq!(err.label(), "malformed");
    server.join().unwrap();
}

#[tokio::test]
async fn a_server_that_does_not_speak_tls_is_a_tls_error() {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    });
    let mut config = KubeletConfig::plain(&format!("https://{addr}/pods"));
    config.insecure_skip_tls_verify = true;
    let err = Client::new(&config).unwrap().pods().await.unwrap_err();
    assert_eq!(err.label(), "tls", "{err}");
    server.join().unwrap();
}
