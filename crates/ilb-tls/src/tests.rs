use super::testing::{TestCa, Validity};
use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Handshakes a client with `client` against `server` over an in-memory pipe, for `name`,
/// then echoes one message; returns the client's error, if any, and the server's certificate.
async fn handshake(
    client: &ClientTls,
    server: &ServerTls,
    name: &str,
) -> Result<(CertificateDer<'static>, bool, Option<String>), std::io::Error> {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let acceptor = server.acceptor().clone();
    let served = tokio::spawn(async move {
        let mut tls = acceptor.accept(b).await?;
        let peer = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(peer_identity);
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await?;
        tls.write_all(&buf).await?;
        tls.flush().await?;
        Ok::<_, std::io::Error>(peer)
    });
    let connected = client.connector().connect(server_name(name).unwrap(), a).await;
    let mut tls = match connected {
        Ok(tls) => tls,
        Err(e) => {
            served.abort();
            return Err(e);
        }
    };
    tls.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    tls.read_exact(&mut buf).await?;
    assert_eq!(&buf, b"ping");
    let (_, conn) = tls.get_ref();
    let cert = conn.peer_certificates().unwrap()[0].clone();
    let resumed = matches!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    let peer = served.await.unwrap()?;
    Ok((cert, resumed, peer))
}

fn client_trusting(ca: &TestCa) -> ClientTls {
    ClientTls::new(&ClientOptions { roots: vec![ca.der()], identity: None }).unwrap()
}

#[tokio::test]
async fn handshakes_resume_and_rotate() {
    let ca = TestCa::new("test ca");
    let first = ca.issue(&["engine.test", "127.0.0.1"]);
    let server = ServerTls::new(&first.identity(), ClientAuth::None).unwrap();
    let client = client_trusting(&ca);
    let (cert, resumed, _) = handshake(&client, &server, "engine.test").await.unwrap();
    assert_eq!(&cert, first.identity().certificate());
    assert!(!resumed, "the first handshake is a full one");
    let (_, resumed, _) = handshake(&client, &server, "engine.test").await.unwrap();
    assert!(resumed, "a reconnect resumes the session");
    let (_, _, _) = handshake(&client, &server, "127.0.0.1").await.unwrap();

    let second = ca.issue(&["engine.test"]);
    server.reload(&second.identity()).unwrap();
    assert_eq!(&server.current_certificate(), second.identity().certificate());
    let fresh = client_trusting(&ca);
    let (cert, _, _) = handshake(&fresh, &server, "engine.test").await.unwrap();
    assert_eq!(&cert, second.identity().certificate(), "new handshakes see the new certificate");
}

#[tokio::test]
async fn failures_are_classified() {
    let ca = TestCa::new("right ca");
    let other = TestCa::new("other ca");
    let good = ServerTls::new(&ca.issue(&["engine.test"]).identity(), ClientAuth::None).unwrap();
    let expired =
        ServerTls::new(&ca.issue_with(&["engine.test"], Validity::Expired).identity(), ClientAuth::None)
            .unwrap();
    let check = |result: Result<_, std::io::Error>, expected: Failure| {
        let error = result.expect_err("handshake must fail");
        assert_eq!(classify_io(&error), Some(expected), "{error}");
    };
    check(handshake(&client_trusting(&other), &good, "engine.test").await, Failure::UnknownIssuer);
    check(handshake(&client_trusting(&ca), &good, "other.test").await, Failure::NameMismatch);
    check(handshake(&client_trusting(&ca), &expired, "engine.test").await, Failure::Expired);
    let empty = ClientTls::new(&ClientOptions::default()).unwrap();
    check(handshake(&empty, &good, "engine.test").await, Failure::UnknownIssuer);
    assert!(Failure::UnknownIssuer.to_string().contains("trusted CA"));
}

#[tokio::test]
async fn mutual_tls_names_the_client_and_refuses_anonymous_ones() {
    let ca = TestCa::new("cp ca");
    let server_id = ca.issue(&["cp.test"]).identity();
    let clients = TestCa::new("data planes");
    let server = ServerTls::new(&server_id, ClientAuth::Required(vec![clients.der()])).unwrap();
    assert!(server.verifies_clients());
    let anonymous = client_trusting(&ca);
    // TLS 1.3: the client finishes its side before the server's refusal arrives, so the
    // failure shows on the first read.
    assert!(handshake(&anonymous, &server, "cp.test").await.is_err());
    let issued = clients.issue_client("spiffe://ilb/dp/eu-1");
    let with_cert =
        ClientTls::new(&ClientOptions { roots: vec![ca.der()], identity: Some(issued.identity()) }).unwrap();
    let (_, _, peer) = handshake(&with_cert, &server, "cp.test").await.unwrap();
    assert_eq!(peer.as_deref(), Some("spiffe://ilb/dp/eu-1"));
    let stranger = TestCa::new("stranger").issue_client("spiffe://evil");
    let wrong = ClientTls::new(&ClientOptions { roots: vec![ca.der()], identity: Some(stranger.identity()) })
        .unwrap();
    assert!(handshake(&wrong, &server, "cp.test").await.is_err());

    let optional = ServerTls::new(&server_id, ClientAuth::Optional(vec![clients.der()])).unwrap();
    let (_, _, peer) = handshake(&anonymous, &optional, "cp.test").await.unwrap();
    assert_eq!(peer, None, "optional client auth lets anonymous clients in, unnamed");
}

#[test]
fn bad_pem_and_mismatched_keys_are_refused() {
    let ca = TestCa::new("ca");
    let a = ca.issue(&["a.test"]);
    let b = ca.issue(&["b.test"]);
    assert!(matches!(
        Identity::from_pem(a.cert_pem.as_bytes(), b.key_pem.as_bytes()),
        Err(TlsError::KeyMismatch)
    ));
    assert!(matches!(Identity::from_pem(b"", a.key_pem.as_bytes()), Err(TlsError::NoCertificate)));
    assert!(matches!(Identity::from_pem(a.cert_pem.as_bytes(), b""), Err(TlsError::NoKey)));
    assert!(Identity::from_pem(a.cert_pem.as_bytes(), a.key_pem.as_bytes()).is_ok());
    assert!(certs_from_pem(b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n").is_err());
    assert!(server_name("[::1]").is_ok());
    assert!(server_name("bad name").is_err());
}
