//! Hardware profiles: the parameters of the engine model for one GPU type serving an 8B-class
//! model, the three built-in profiles (`l4`, `a100`, `h100`), validation, and the closed-form
//! sustainable capacity estimate the control plane uses as per-replica capacity.

use serde::{Deserialize, Serialize};

/// The engine model's parameters for one hardware type. Every field has a default (the `a100`
/// profile), so a TOML table only needs the fields it overrides:
///
/// ```toml
/// name = "a100-tuned"
/// max_num_seqs = 128
/// iteration_base_ms = 12.0
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HardwareProfile {
    /// Profile name, informational (e.g. `"a100"`).
    pub name: String,
    /// Most sequences in one running batch (vLLM `--max-num-seqs`). Example: 256.
    pub max_num_seqs: u32,
    /// Most tokens computed in one iteration, decode tokens plus prefill chunk tokens
    /// (vLLM `--max-num-batched-tokens`, chunked prefill). Must be >= `max_num_seqs`. Example: 8192.
    pub max_num_batched_tokens: u32,
    /// KV-cache capacity of one replica, in blocks of 16 tokens. Example: 25000 (400k tokens).
    pub kv_blocks: u32,
    /// Fixed cost of one iteration in milliseconds (reading the weights once). Example: 10.0.
    pub iteration_base_ms: f64,
    /// Cost of each prompt token computed in an iteration, in microseconds. Prompt tokens served
    /// from the prefix cache cost nothing. Example: 100.0 (a 1000-token prompt: 100 ms).
    pub prefill_token_us: f64,
    /// Cost of each decoding sequence in an iteration, in microseconds (attention over its KV
    /// and its share of the batch). Example: 80.0 (a batch of 100 adds 8 ms per token).
    pub decode_seq_us: f64,
    /// Replicas behind the engine's endpoint; each is an independent model instance with its
    /// own batch and KV cache. Example: 2.
    pub replicas: u32,
}

impl Default for HardwareProfile {
    fn default() -> Self {
        Self::a100()
    }
}

/// Why a profile was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    #[error("profile field {field}: {problem}")]
    Invalid { field: &'static str, problem: String },
    #[error("unknown hardware profile {0:?} (known: l4, a100, h100)")]
    Unknown(String),
}

impl HardwareProfile {
    /// Names accepted by [`HardwareProfile::by_name`].
    pub const NAMES: [&'static str; 3] = ["l4", "a100", "h100"];

    /// Small GPU (24 GB, ~300 GB/s, fp8 weights): slow prefill, ~30 ms per decode step, a few
    /// thousand KV blocks. TTFT of a 1000-token prompt ~230 ms idle.
    pub fn l4() -> Self {
        Self {
            name: "l4".into(),
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            kv_blocks: 2_000,
            iteration_base_ms: 28.0,
            prefill_token_us: 200.0,
            decode_seq_us: 250.0,
            replicas: 1,
        }
    }

    /// Mid GPU (80 GB, ~2 TB/s): ~10 ms per decode step at batch 1, ~30 ms at batch 256.
    pub fn a100() -> Self {
        Self {
            name: "a100".into(),
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            kv_blocks: 25_000,
            iteration_base_ms: 10.0,
            prefill_token_us: 100.0,
            decode_seq_us: 80.0,
            replicas: 2,
        }
    }

    /// Large GPU (80 GB HBM3, ~3.3 TB/s): ~6 ms per decode step at batch 1.
    pub fn h100() -> Self {
        Self {
            name: "h100".into(),
            max_num_seqs: 512,
            max_num_batched_tokens: 8192,
            kv_blocks: 30_000,
            iteration_base_ms: 6.0,
            prefill_token_us: 45.0,
            decode_seq_us: 40.0,
            replicas: 2,
        }
    }

    /// A built-in profile by name (`l4`, `a100`, `h100`, case-insensitive).
    pub fn by_name(name: &str) -> Result<Self, ProfileError> {
        match name.to_ascii_lowercase().as_str() {
            "l4" => Ok(Self::l4()),
            "a100" => Ok(Self::a100()),
            "h100" => Ok(Self::h100()),
            _ => Err(ProfileError::Unknown(name.to_owned())),
        }
    }

    /// Checks every field; the model is only built from a validated profile.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let invalid = |field, problem: &str| Err(ProfileError::Invalid { field, problem: problem.into() });
        if self.max_num_seqs == 0 {
            return invalid("max_num_seqs", "must be at least 1");
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return invalid("max_num_batched_tokens", "must be at least max_num_seqs");
        }
        if self.kv_blocks == 0 {
            return invalid("kv_blocks", "must be at least 1");
        }
        if self.replicas == 0 {
            return invalid("replicas", "must be at least 1");
        }
        for (field, value) in [
            ("iteration_base_ms", self.iteration_base_ms),
            ("prefill_token_us", self.prefill_token_us),
            ("decode_seq_us", self.decode_seq_us),
        ] {
            if !value.is_finite() || value < 0.0 {
                return invalid(field, "must be a finite number >= 0");
            }
        }
        if self.iteration_base_ms <= 0.0 {
            return invalid("iteration_base_ms", "must be > 0");
        }
        Ok(())
    }

    /// Approximate saturation throughput of **one replica** in requests per second, for
    /// requests of `mean_prompt_tokens` computed prompt tokens (after cache hits) and
    /// `mean_output_tokens` output tokens.
    ///
    /// At arrival rate λ the mean iteration time `c` satisfies
    /// `c = base + decode_seq·B + prefill_token·(λ·P·c)` with batch `B = λ·O·c` (Little's law
    /// on decoding sequences), so `c = base / (1 − λ·(P·prefill_token + O·decode_seq))`.
    /// Capacity is the λ at which `B` reaches the largest batch the replica holds,
    /// `B_max = min(max_num_seqs, kv_blocks·16 / (P + O))`:
    ///
    /// `λ_max = B_max / (O·base + B_max·(P·prefill_token + O·decode_seq))`.
    ///
    /// This is a saturation figure: latency is already high there; a caller wanting headroom
    /// multiplies it by a target utilisation (e.g. 0.8).
    pub fn capacity_rps(&self, mean_prompt_tokens: f64, mean_output_tokens: f64) -> f64 {
        let prompt = mean_prompt_tokens.max(0.0);
        let output = mean_output_tokens.max(1.0);
        let base = self.iteration_base_ms / 1e3;
        let prefill = self.prefill_token_us / 1e6;
        let decode = self.decode_seq_us / 1e6;
        let kv_seqs = f64::from(self.kv_blocks) * 16.0 / (prompt + output);
        let batch_max = f64::from(self.max_num_seqs).min(kv_seqs).max(1.0);
        batch_max / (output * base + batch_max * (prompt * prefill + output * decode))
    }

    /// [`Self::capacity_rps`] times the replica count: the whole engine's saturation throughput.
    pub fn engine_capacity_rps(&self, mean_prompt_tokens: f64, mean_output_tokens: f64) -> f64 {
        self.capacity_rps(mean_prompt_tokens, mean_output_tokens) * f64::from(self.replicas)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_validate_and_order_by_speed() {
        for name in HardwareProfile::NAMES {
            let profile = HardwareProfile::by_name(name).expect("builtin");
            profile.validate().expect("valid");
        }
        let l4 = HardwareProfile::l4().capacity_rps(1000.0, 200.0);
        let a100 = HardwareProfile::a100().capacity_rps(1000.0, 200.0);
        let h100 = HardwareProfile::h100().capacity_rps(1000.0, 200.0);
        assert!(l4 < a100 && a100 < h100, "{l4} {a100} {h100}");
        assert!((1.0..50.0).contains(&a100), "a100 capacity {a100}");
    }

    #[test]
    fn toml_overrides_fields_and_rejects_unknown() {
        let profile: HardwareProfile = toml_like(r#"{"max_num_seqs": 8, "replicas": 3}"#);
        assert_eq!(profile.max_num_seqs, 8);
        assert_eq!(profile.replicas, 3);
        assert_eq!(profile.kv_blocks, HardwareProfile::a100().kv_blocks);
        assert!(serde_json::from_str::<HardwareProfile>(r#"{"bogus": 1}"#).is_err());
        assert!(HardwareProfile::by_name("tpu").is_err());
    }

    fn toml_like(json: &str) -> HardwareProfile {
        serde_json::from_str(json).expect("parse")
    }

    #[test]
    fn validation_names_the_field() {
        let bad = HardwareProfile { max_num_batched_tokens: 1, ..HardwareProfile::a100() };
        let err = bad.validate().expect_err("invalid");
        assert!(err.to_string().contains("max_num_batched_tokens"), "{err}");
    }
}
