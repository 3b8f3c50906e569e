//! `ilb epp --tls-cert/--tls-key` serves its gRPC listener over TLS with ALPN `h2` (what an
//! Envoy `UpstreamTlsContext` with `alpn_protocols: ["h2"]` asks for); the real-Envoy test is
//! `crates/ilb-epp/tests/envoy.rs`.
#![allow(clippy::disallowed_methods)] // the test writes certificate files and starts the binary

use ilb_tls::testing::TestCa;
use ilb_tls::{ClientOptions, ClientTls};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[tokio::test]
async fn epp_serves_grpc_over_tls_with_h2() {
    let ca = TestCa::new("ilb epp cli test CA");
    let issued = ca.issue(&["127.0.0.1"]);
    let dir = std::env::temp_dir().join(format!("ilb-epp-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, &issued.cert_pem).unwrap();
    std::fs::write(&key, &issued.key_pem).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ilb"))
        .args(["--log", "warn", "epp", "--listen", "127.0.0.1:0", "--engine", "http://127.0.0.1:9"])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().rsplit(' ').next().unwrap_or_default().to_owned();
    if !line.contains("gRPC over TLS") {
        let _ = child.kill();
        panic!("ilb epp printed {line:?}");
    }

    let client = ClientTls::new(&ClientOptions { roots: vec![ca.der()], identity: None }).unwrap();
    let mut config = client.config_without_alpn();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = ilb_tls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let name = ilb_tls::server_name("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await.expect("a TLS handshake with the CA's certificate");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "gRPC needs h2 by ALPN");
    drop(tls);
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(child.wait().unwrap().success(), "ilb epp stops cleanly on SIGTERM");
    let _ = std::fs::remove_dir_all(&dir);
}
