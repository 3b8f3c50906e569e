//! TLS on the gRPC listener (`ilb epp --tls-cert/--tls-key`, or `[data_plane.tls]`): the
//! gateway connects to the EPP over TLS with ALPN `h2`, as the Gateway API Inference Extension's
//! own EPP serves by default. The certificate rotates in place (`ilb_tls::ServerTls`).
//!
//! Handshakes run beside the accept loop, one task each, within the data plane's
//! `header_read` timeout, so a client that stalls its handshake holds nothing up; a failed one
//! is logged and dropped. Connections then reach tonic as [`TlsConn`]s, without vectored
//! writes (`io.rs` says why).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A TLS connection from the gateway, as tonic's server takes it.
pub(crate) struct TlsConn(tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    // Not vectored, so that h2 gathers small frames into one buffer (io.rs).

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The TLS connections accepted on `listener` (without Nagle: the answers are small writes
/// that must leave at once), until `shutdown` or until the server stops taking them.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: ilb_tls::ServerTls,
    handshake_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> impl futures_util::Stream<Item = io::Result<TlsConn>> + Send + 'static {
    let (connections, accepted) = mpsc::channel::<TlsConn>(64);
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
                        let _ = connections.send(TlsConn(tls)).await;
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
