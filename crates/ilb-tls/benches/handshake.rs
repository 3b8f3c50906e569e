//! CPU cost of TLS handshakes as ilb configures them (ring, ECDSA P-256 certificates, TLS 1.3,
//! X25519), client and server together, in memory (no sockets): a full handshake, and a
//! resumed one (what a reconnect to an engine costs after the first), plus one small request
//! and response sealed and opened (the per-request record cost on a kept-alive connection).
//!
//! `cargo bench -p ilb-tls --features test-certs --bench handshake`

use criterion::{criterion_group, criterion_main, Criterion};
use ilb_tls::rustls::{ClientConnection, ServerConnection};
use ilb_tls::testing::TestCa;
use ilb_tls::{ClientAuth, ClientOptions, ClientTls, ServerTls};
use std::io::{Read, Write};

/// Moves TLS bytes both ways until neither side has anything to send.
fn pump(client: &mut ClientConnection, server: &mut ServerConnection) {
    let mut buf = Vec::with_capacity(8192);
    loop {
        let mut moved = false;
        while client.wants_write() {
            buf.clear();
            client.write_tls(&mut buf).unwrap();
            let mut rd = &buf[..];
            while !rd.is_empty() {
                server.read_tls(&mut rd).unwrap();
            }
            server.process_new_packets().unwrap();
            moved = true;
        }
        while server.wants_write() {
            buf.clear();
            server.write_tls(&mut buf).unwrap();
            let mut rd = &buf[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
            }
            client.process_new_packets().unwrap();
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

fn handshake(client: &ClientTls, server: &ServerTls) -> (ClientConnection, ServerConnection) {
    let name = ilb_tls::server_name("127.0.0.1").unwrap();
    let mut c = ClientConnection::new(client.config(), name).unwrap();
    let mut s = ServerConnection::new(server.config()).unwrap();
    pump(&mut c, &mut s);
    assert!(!c.is_handshaking() && !s.is_handshaking());
    (c, s)
}

fn bench(c: &mut Criterion) {
    let ca = TestCa::new("bench ca");
    let server = ServerTls::new(&ca.issue(&["127.0.0.1"]).identity(), ClientAuth::None).unwrap();
    let options = ClientOptions { roots: vec![ca.der()], identity: None };
    c.bench_function("full handshake (client + server)", |b| {
        b.iter_batched(
            || ClientTls::new(&options).unwrap(),
            |client| handshake(&client, &server),
            criterion::BatchSize::SmallInput,
        )
    });
    let client = ClientTls::new(&options).unwrap();
    handshake(&client, &server);
    c.bench_function("resumed handshake (client + server)", |b| {
        b.iter(|| {
            let (c, _) = handshake(&client, &server);
            debug_assert!(matches!(c.handshake_kind(), Some(ilb_tls::rustls::HandshakeKind::Resumed)));
        })
    });
    let (mut conn_c, mut conn_s) = handshake(&client, &server);
    let request = vec![b'x'; 600];
    let response = vec![b'y'; 900];
    let mut sink = vec![0u8; 4096];
    c.bench_function("600 B request + 900 B response, sealed and opened", |b| {
        b.iter(|| {
            conn_c.writer().write_all(&request).unwrap();
            pump(&mut conn_c, &mut conn_s);
            let n = conn_s.reader().read(&mut sink).unwrap();
            assert_eq!(n, request.len());
            conn_s.writer().write_all(&response).unwrap();
            pump(&mut conn_c, &mut conn_s);
            let n = conn_c.reader().read(&mut sink).unwrap();
            assert_eq!(n, response.len());
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
