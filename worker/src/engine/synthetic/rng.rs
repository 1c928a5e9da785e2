//! A small deterministic PRNG (SplitMix64) and the word list the synthetic
//! engine speaks in. Stable across platforms and Rust releases, so a prompt
//! and seed always give the same reply.

/// SplitMix64: tiny, fast, and good enough to pick words.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (returns `lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo;
        if span == u64::MAX {
            return self.next_u64();
        }
        lo + self.next_u64() % (span + 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// A word from [`WORDS`], without the leading space.
    pub fn word(&mut self) -> &'static str {
        WORDS[self.below(WORDS.len())].trim_start()
    }

    /// `n` words joined by spaces.
    pub fn words(&mut self, n: usize) -> String {
        let mut s = String::new();
        for i in 0..n {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(self.word());
        }
        s
    }

    /// `n` alphanumeric characters.
    pub fn alnum(&mut self, n: usize) -> String {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..n)
            .map(|_| ALNUM[self.below(ALNUM.len())] as char)
            .collect()
    }
}

/// Common English words, each a single o200k token with its leading space
/// (checked by a test), so a reply of N words is exactly N tokens.
pub const WORDS: &[&str] = &[
    " the",
    " model",
    " answer",
    " system",
    " data",
    " time",
    " value",
    " result",
    " simple",
    " clear",
    " small",
    " large",
    " quick",
    " river",
    " light",
    " stone",
    " garden",
    " market",
    " window",
    " paper",
    " signal",
    " pattern",
    " number",
    " question",
    " reason",
    " method",
    " friendly",
    " useful",
    " careful",
    " early",
    " later",
    " often",
    " always",
    " never",
    " again",
    " because",
    " while",
    " about",
    " between",
    " under",
    " over",
    " through",
    " across",
    " around",
    " before",
    " after",
    " within",
    " without",
    " into",
    " from",
    " with",
    " and",
    " but",
    " also",
    " then",
    " here",
    " there",
    " where",
    " when",
    " which",
    " every",
    " some",
    " many",
    " few",
    " more",
    " most",
    " other",
    " same",
    " different",
    " good",
    " great",
    " new",
    " old",
    " long",
    " short",
    " high",
    " low",
    " open",
    " close",
    " bright",
    " dark",
    " warm",
    " cold",
    " fast",
    " slow",
    " north",
    " south",
    " city",
    " village",
    " mountain",
    " ocean",
    " forest",
    " road",
    " bridge",
    " house",
    " table",
    " story",
    " idea",
    " plan",
    " step",
    " part",
    " point",
    " line",
    " word",
    " page",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_one_token_with_its_leading_space() {
        for w in WORDS {
            assert_eq!(super::super::tokenizer::count(w), 1, "{w:?}");
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(42);
        let b: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
        let mut r = Rng::new(7);
        for _ in 0..100 {
            let v = r.range(3, 5);
            assert!((3..=5).contains(&v));
        }
    }
}
