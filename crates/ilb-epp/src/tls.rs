//! TLS on the gRPC listener (`ilb epp --tls-cert/--tls-key`, or `[data_plane.tls]`): the
//! gateway connects to the EPP over TLS with ALPN `h2`, as the Gateway API Inference Extension's
//! own EPP serves by default. The certificate rotates in place (`ilb_tls::ServerTls`).
//!
//! Handshakes run beside the accept loop, one task each, within the data plane's
//! `header_read` timeout, so a client that stalls its handshake holds nothing up; a failed one
//! is logged and dropped. Connections then reach the HTTP/2 server (`server.rs`) without vectored writes (`io.rs`
//! says why).

use crate::io::Unvectored;
use std::io;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;

/// The TLS connections accepted on `listener` (without Nagle: the answers are small writes
/// that must leave at once), until `shutdown` or until the server stops taking them.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: ilb_tls::ServerTls,
    handshake_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> impl futures_util::Stream<Item = io::Result<Unvectored<TlsStream<TcpStream>>>> + Send + 'static {
    let (connections, accepted) = mpsc::channel::<Unvectored<TlsStream<TcpStream>>>(64);
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(%error, "epp accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = async { shutdown.wait_for(|stop| *stop).await.map(|_| ()) } => return,
                _ = connections.closed() => return,
            };
            let _ = stream.set_nodelay(true);
            let (tls, connections) = (tls.clone(), connections.clone());
            tokio::spawn(async move {
                match tls.handshake(stream, handshake_timeout).await {
                    Ok(tls) => {
                        let _ = connections.send(Unvectored(tls)).await;
                    }
                    Err(error) => tracing::warn!(%error, reason = error.reason(), "epp tls handshake failed"),
                }
            });
        }
    });
    futures_util::stream::unfold(accepted, |mut accepted| async move {
        accepted.recv().await.map(|connection| (Ok(connection), accepted))
    })
}
