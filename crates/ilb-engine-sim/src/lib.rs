//! `ilb-engine-sim`: a realistic fake inference engine.
//!
//! - [`model`]: the pure engine model (continuous batching, chunked prefill, KV blocks, prefix
//!   cache), driven in real time or in virtual time.
//! - [`profile`]: hardware profiles (`l4`, `a100`, `h100`) and the capacity estimate.
//! - [`tokenize`]: deterministic pseudo-tokenisation, the chat template and output words.
//! - [`server`]: the OpenAI-compatible HTTP engine (hyper 1) with vLLM metrics and faults:
//!   [`spawn`], [`spawn_many`], [`EngineHandle`].
//!
//! **Invariant:** `model`, `profile` and `tokenize` do no IO, read no clock and use no
//! randomness, so a fleet simulator can run them in virtual time. Only `clock` reads the clock.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

mod clock;
pub mod model;
pub mod profile;
pub mod server;
pub mod tokenize;

pub use model::{EngineModel, ModelStats, Nanos, Outcome, Request, SubmitError, TokenEvent};
pub use profile::{HardwareProfile, ProfileError};
pub use server::{spawn, spawn_many, EngineConfig, EngineHandle, EngineStats, Error, Faults, FaultsError};
