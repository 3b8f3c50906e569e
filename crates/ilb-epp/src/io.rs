//! The gateway's connection as the HTTP/2 server takes it, without vectored writes.
//!
//! h2 copies a DATA frame into its 16 KiB write buffer only when the payload is under its
//! chain threshold: 256 bytes when the transport does vectored writes, 1 KiB when it does not.
//! A frame at or above the threshold is written by itself (one `writev` of the buffer and the
//! payload), and nothing else is buffered until it has gone. Every answer the EPP sends with a
//! body in it (the request body sent back, each response chunk) is over 256 bytes, so with a
//! vectored transport each took a send of its own even when the answers of many streams were
//! ready together. Without, answers under 1 KiB (small requests and responses) share one write
//! per turn of the connection; larger chunks go out in a write of their own as before.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// An I/O object that does not announce vectored writes (see the module's doc).
pub(crate) struct Unvectored<T>(pub(crate) T);

impl<T: AsyncRead + Unpin> AsyncRead for Unvectored<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Unvectored<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    // `poll_write_vectored` and `is_write_vectored` keep their defaults: one buffer at a time.

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
