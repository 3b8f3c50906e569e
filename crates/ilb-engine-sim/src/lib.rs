//! `ilb-engine-sim`: a realistic fake inference engine.
//!
//! - [`model`]: the pure engine model (continuous batching, chunked prefill, KV blocks, prefix
//!   cache), driven in real or virtual time.
//! - [`profile`]: hardware profiles (`l4`, `a100`, `h100`) and the capacity estimate.
//! - [`tokenize`]: deterministic pseudo-tokenisation, the chat template and output words.
//!
//! **Invariant:** `model`, `profile` and `tokenize` do no IO, read no clock and use no
//! randomness, so a fleet simulator can run them in virtual time.

pub mod model;
pub mod profile;

pub use model::{EngineModel, ModelStats, Nanos, Outcome, Request, SubmitError, TokenEvent};
pub use profile::{HardwareProfile, ProfileError};
