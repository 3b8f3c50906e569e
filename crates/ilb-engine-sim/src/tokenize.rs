//! Deterministic pseudo-tokenisation for the HTTP simulator: text becomes token ids (one per
//! whitespace-separated word; words longer than 12 bytes are cut into 4-byte pieces), chat
//! messages go through a fixed template (role marker, content, end marker; then the assistant
//! marker as the generation prompt) so a follow-up turn's prompt starts with every token of
//! the earlier turn's prompt, and output text is a sequence of pseudo-words.

/// Token ids below this are text; markers sit above it.
pub const MARKER_BASE: u32 = 128_000;
const END_OF_MESSAGE: u32 = MARKER_BASE + 10;
const ASSISTANT: u32 = MARKER_BASE + 2;

/// Appends the tokens of `text`.
pub fn tokenize_into(text: &str, out: &mut Vec<u32>) {
    for word in text.split_whitespace() {
        let bytes = word.as_bytes();
        if bytes.len() <= 12 {
            out.push(token_of(bytes));
        } else {
            out.extend(bytes.chunks(4).map(token_of));
        }
    }
}

/// Number of tokens `tokenize_into` would produce.
pub fn count_tokens(text: &str) -> usize {
    text.split_whitespace().map(|word| if word.len() <= 12 { 1 } else { word.len().div_ceil(4) }).sum()
}

fn token_of(bytes: &[u8]) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(bytes) % u64::from(MARKER_BASE)) as u32
}

/// The marker token of a chat role.
pub fn role_marker(role: &str) -> u32 {
    MARKER_BASE
        + match role {
            "system" | "developer" => 0,
            "user" => 1,
            "assistant" => 2,
            "tool" | "function" => 3,
            _ => 4,
        }
}

/// Builds a chat prompt incrementally: `push_message` per message in order, then `finish`.
#[derive(Default)]
pub struct ChatPrompt {
    tokens: Vec<u32>,
}

impl ChatPrompt {
    /// A prompt that continues an earlier conversation's tokens.
    pub fn continuing(tokens: Vec<u32>) -> ChatPrompt {
        ChatPrompt { tokens }
    }

    /// Appends an assistant answer to a finished prompt (which ends with the assistant
    /// marker): its text, then the end marker, as a chat template renders the turn.
    pub fn push_reply(&mut self, text: &str) {
        tokenize_into(text, &mut self.tokens);
        self.tokens.push(END_OF_MESSAGE);
    }

    /// The tokens so far, without the generation prompt.
    pub fn into_tokens(self) -> Vec<u32> {
        self.tokens
    }

    pub fn push_message(&mut self, role: &str, content_parts: &[&str]) {
        self.tokens.push(role_marker(role));
        for part in content_parts {
            tokenize_into(part, &mut self.tokens);
        }
        self.tokens.push(END_OF_MESSAGE);
    }

    /// Appends the assistant marker (the generation prompt) and returns the tokens.
    pub fn finish(mut self) -> Vec<u32> {
        self.tokens.push(ASSISTANT);
        self.tokens
    }
}

/// Seed for a request's output words: equal prompts give equal outputs.
pub fn output_seed(engine_seed: u64, prompt: &[u32]) -> u64 {
    let mut hash = engine_seed ^ 0xcbf2_9ce4_8422_2325;
    for token in prompt {
        hash = (hash ^ u64::from(*token)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The text of output token `index` (0-based): a pseudo-word with a leading space.
pub fn output_word(seed: u64, index: u32) -> &'static str {
    let mut x = seed.wrapping_add(u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    WORDS_SPACED[(x % WORDS_SPACED.len() as u64) as usize]
}

/// Output pseudo-words, each with the leading space a real tokenizer's word token carries.
const WORDS_SPACED: [&str; 64] = [
    " the", " model", " engine", " token", " cache", " batch", " prefix", " latency", " queue", " request",
    " stream", " region", " cluster", " weight", " route", " signal", " answer", " simple", " quick",
    " steady", " warm", " cold", " block", " chunk", " decode", " prefill", " serve", " reply", " value",
    " result", " small", " large", " fast", " slow", " first", " next", " last", " every", " some", " many",
    " few", " good", " well", " is", " are", " was", " and", " or", " of", " to", " in", " on", " for",
    " with", " as", " at", " by", " from", " this", " that", " it", " we", " you", " they",
];

/// The whole output text of `count` tokens.
pub fn output_text(seed: u64, count: u32) -> String {
    let mut text = String::with_capacity(count as usize * 7);
    for index in 0..count {
        text.push_str(output_word(seed, index));
    }
    text
}

/// A deterministic unit vector of `dims` dimensions for an embedding input.
pub fn embedding(text: &str, dims: usize) -> Vec<f32> {
    let seed = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
    let raw: Vec<f32> = (0..dims as u32)
        .map(|index| {
            let word = output_seed(seed, &[index]);
            (word >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
    raw.into_iter().map(|x| x / norm).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_long_words() {
        let mut tokens = Vec::new();
        tokenize_into("hello  world\nsupercalifragilistic", &mut tokens);
        assert_eq!(tokens.len(), 2 + 5);
        assert_eq!(count_tokens("hello  world\nsupercalifragilistic"), 7);
        let mut again = Vec::new();
        tokenize_into("hello world", &mut again);
        assert_eq!(&tokens[..2], &again[..]);
        assert!(tokens.iter().all(|token| *token < MARKER_BASE));
    }

    #[test]
    fn follow_up_turn_extends_the_earlier_prompt() {
        let mut first = ChatPrompt::default();
        first.push_message("system", &["be brief"]);
        first.push_message("user", &["what is a cache"]);
        let first = first.finish();
        let seed = output_seed(1, &first);
        let answer = output_text(seed, 20);
        let mut second = ChatPrompt::default();
        second.push_message("system", &["be brief"]);
        second.push_message("user", &["what is a cache"]);
        second.push_message("assistant", &[&answer]);
        second.push_message("user", &["and a prefix"]);
        let second = second.finish();
        assert_eq!(&second[..first.len()], &first[..]);
        assert_eq!(count_tokens(&answer), 20, "each output word is one token");
    }

    #[test]
    fn outputs_and_embeddings_are_deterministic() {
        assert_eq!(output_text(42, 16), output_text(42, 16));
        assert_ne!(output_text(42, 16), output_text(43, 16));
        assert_eq!(embedding("a", 16), embedding("a", 16));
        let norm: f32 = embedding("a", 16).iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4);
    }
}
