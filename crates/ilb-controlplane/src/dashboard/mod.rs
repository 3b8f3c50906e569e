//! The live dashboard: one self-contained HTML page (no CDN, no build step; its script and
//! styles ship inside the binary) that polls `/v1/state` every second and draws the latest
//! solve, the fleet by region, the weight matrix as a heat map with the numbers behind each
//! weight, TTFT over time per engine, penalties, sheds and unhealthy engines, and every engine's
//! load and signals. `tests/dashboard.rs` checks it in headless Chromium against a live plan.

/// The page served at `GET /`.
pub const PAGE: &str = include_str!("index.html");
