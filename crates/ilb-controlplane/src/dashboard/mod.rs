//! The live dashboard: one self-contained HTML page (no CDN; its script and styles ship inside
//! the binary) that polls `/v1/state` and draws the fleet, the weight matrix and the latest solve.

/// The page served at `GET /`.
pub const PAGE: &str = include_str!("index.html");
