//! The candidates one request has tried, kept inline: the request path allocates nothing for
//! them (a `Vec` cost one allocation per request).

/// Candidates already tried by one request, without a heap allocation for the usual few.
#[derive(Default)]
pub struct Tried {
    len: usize,
    inline: [usize; 4],
    /// All of them, once there are more than `inline` holds.
    spilled: Vec<usize>,
}

impl Tried {
    pub fn as_slice(&self) -> &[usize] {
        if self.len <= self.inline.len() {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }

    pub fn push(&mut self, candidate: usize) {
        if self.len < self.inline.len() {
            self.inline[self.len] = candidate;
        } else {
            if self.len == self.inline.len() {
                self.spilled.extend_from_slice(&self.inline);
            }
            self.spilled.push(candidate);
        }
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::Tried;

    #[test]
    fn keeps_every_candidate_in_order_past_the_inline_ones() {
        let mut tried = Tried::default();
        assert!(tried.is_empty() && tried.as_slice().is_empty());
        for n in 0..7 {
            tried.push(10 + n);
            assert_eq!(tried.len(), n + 1);
            assert_eq!(tried.as_slice(), (10..=10 + n).collect::<Vec<_>>());
        }
    }
}
