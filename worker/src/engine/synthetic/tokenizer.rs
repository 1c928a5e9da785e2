//! Prompt rendering and token counting with a real BPE (o200k_base, embedded
//! in `tiktoken-rs`, so nothing downloads).
//!
//! The prompt is rendered as a chat template into one token sequence:
//!
//! - a `tools` block when tools are given (name, description and parameter
//!   schema of each tool), then
//! - every message as `<start> role[ name] <sep> content <end>`, and
//! - a closing `<start> assistant <sep>` that primes the reply.
//!
//! So every message costs its content plus a chat-template overhead of four
//! tokens (three framing tokens and the role). The framing tokens use ids above
//! the o200k vocabulary, so they never collide with text. Tool calls of
//! earlier assistant turns count (name and arguments); their reasoning text
//! does not (chat templates drop it).
//!
//! Images are not fetched. Each image part costs a documented fixed amount
//! (see [`image_tokens`]), represented in the sequence by that many copies of
//! a token derived from the image URL, so two different images never share a
//! cached prefix and `prompt_tokens` is simply the sequence length.

use crate::seam::tokens::{fnv1a, saturate};
use inference_proto::v1 as pb;
use tiktoken_rs::{o200k_base_singleton, CoreBPE, Rank};

/// Framing tokens of the chat template (outside the o200k vocabulary).
const MSG_START: Rank = 1 << 30;
const MSG_SEP: Rank = MSG_START + 1;
const MSG_END: Rank = MSG_START + 2;
/// Image placeholder tokens live in `[IMAGE_BASE, IMAGE_BASE + 2^24)`.
const IMAGE_BASE: Rank = 1 << 31;

/// The tokens charged for one image part, by its `detail`: `low` costs 85
/// tokens, `high`, `auto` and unset cost 765 (the cost of a 1024x1024 image
/// in 512-pixel tiles: 85 base + 4 tiles x 170). Reported in
/// `Usage.image_tokens` and included in `prompt_tokens`.
pub fn image_tokens(detail: &str) -> u32 {
    if detail.eq_ignore_ascii_case("low") {
        85
    } else {
        765
    }
}

/// The shared o200k_base tokenizer.
pub fn bpe() -> &'static CoreBPE {
    o200k_base_singleton()
}

/// Token count of plain text.
pub fn count(text: &str) -> u32 {
    saturate(bpe().encode_ordinary(text).len())
}

/// A rendered prompt: the full token sequence and how much of it are images.
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    pub tokens: Vec<Rank>,
    pub image_tokens: u32,
    pub image_parts: u32,
}

impl Prompt {
    /// `prompt_tokens` as reported in usage (images included).
    pub fn len(&self) -> u32 {
        saturate(self.tokens.len())
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Renders a request's tools and messages into the template's token sequence.
pub fn render(req: &pb::GenerateRequest) -> Prompt {
    let bpe = bpe();
    let mut p = Prompt::default();
    let push_text = |tokens: &mut Vec<Rank>, text: &str| {
        if !text.is_empty() {
            tokens.extend(bpe.encode_ordinary(text));
        }
    };
    if !req.tools.is_empty() {
        p.tokens.push(MSG_START);
        push_text(&mut p.tokens, "tools");
        p.tokens.push(MSG_SEP);
        for tool in &req.tools {
            push_text(&mut p.tokens, &tool.name);
            push_text(&mut p.tokens, "\n");
            push_text(&mut p.tokens, &tool.description);
            push_text(&mut p.tokens, "\n");
            push_text(&mut p.tokens, &tool.parameters_json);
            push_text(&mut p.tokens, "\n");
        }
        p.tokens.push(MSG_END);
    }
    for m in &req.messages {
        p.tokens.push(MSG_START);
        push_text(&mut p.tokens, &m.role);
        if !m.name.is_empty() {
            push_text(&mut p.tokens, " ");
            push_text(&mut p.tokens, &m.name);
        }
        p.tokens.push(MSG_SEP);
        for part in &m.content {
            match &part.part {
                Some(pb::content_part::Part::Text(t)) => push_text(&mut p.tokens, t),
                Some(pb::content_part::Part::ImageUrl(img)) => {
                    let n = image_tokens(&img.detail);
                    let marker = IMAGE_BASE + (fnv1a(img.url.as_bytes()) as Rank & 0x00ff_ffff);
                    p.tokens.extend(std::iter::repeat_n(marker, n as usize));
                    p.image_tokens += n;
                    p.image_parts += 1;
                }
                None => {}
            }
        }
        for call in &m.tool_calls {
            push_text(&mut p.tokens, &call.name);
            push_text(&mut p.tokens, &call.arguments);
        }
        p.tokens.push(MSG_END);
    }
    p.tokens.push(MSG_START);
    push_text(&mut p.tokens, "assistant");
    p.tokens.push(MSG_SEP);
    p
}

/// One streamed piece of output text and the tokens it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub text: String,
    pub tokens: u32,
}

/// Splits text into BPE tokens, merging the few tokens that end inside a
/// multi-byte character so every piece is valid UTF-8. The pieces concatenate
/// to the input exactly, and their token counts sum to the BPE count.
pub fn pieces(text: &str) -> Vec<Piece> {
    let bpe = bpe();
    let mut out = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_tokens = 0u32;
    for bytes in bpe._decode_native_and_split(bpe.encode_ordinary(text)) {
        pending.extend_from_slice(&bytes);
        pending_tokens += 1;
        if let Ok(s) = std::str::from_utf8(&pending) {
            out.push(Piece {
                text: s.to_owned(),
                tokens: pending_tokens,
            });
            pending.clear();
            pending_tokens = 0;
        }
    }
    if !pending.is_empty() {
        out.push(Piece {
            text: String::from_utf8_lossy(&pending).into_owned(),
            tokens: pending_tokens,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> pb::Message {
        pb::Message {
            role: "user".into(),
            content: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text(text.into())),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn counts_real_bpe_tokens() {
        // Known o200k_base counts.
        assert_eq!(count("hello world"), 2);
        assert_eq!(count(""), 0);
        assert!(count("The quick brown fox jumps over the lazy dog.") >= 9);
    }

    #[test]
    fn prompt_is_content_plus_template_overhead() {
        let one = GenerateReqBuilder::new().msg(user("hello world")).build();
        let p = render(&one);
        // 2 content + start, "user", sep, end + start, "assistant", sep.
        assert_eq!(p.len(), 2 + 4 + 3);
        let two = GenerateReqBuilder::new()
            .msg(user("hello world"))
            .msg(user("hello world"))
            .build();
        assert_eq!(render(&two).len(), 2 * (2 + 4) + 3);
    }

    #[test]
    fn images_cost_a_fixed_documented_amount() {
        let mut m = user("look");
        for detail in ["low", "high", "auto"] {
            m.content.push(pb::ContentPart {
                part: Some(pb::content_part::Part::ImageUrl(pb::ImageUrl {
                    url: format!("https://example.com/{detail}.png"),
                    detail: detail.into(),
                })),
            });
        }
        let p = render(&GenerateReqBuilder::new().msg(m).build());
        assert_eq!(p.image_tokens, 85 + 765 + 765);
        assert_eq!(p.image_parts, 3);
        assert_eq!(p.len(), 1 + 4 + 3 + 85 + 765 + 765);
    }

    #[test]
    fn pieces_concatenate_to_the_input_and_sum_to_the_count() {
        for text in [
            "hello world",
            "naïve café — 日本語のテキスト 🎉🎉",
            "{\"a\": [1, 2]}",
        ] {
            let ps = pieces(text);
            let joined: String = ps.iter().map(|p| p.text.as_str()).collect();
            assert_eq!(joined, text);
            assert_eq!(ps.iter().map(|p| p.tokens).sum::<u32>(), count(text));
        }
    }

    /// Small helper for tests across the crate.
    pub struct GenerateReqBuilder(pb::GenerateRequest);
    impl GenerateReqBuilder {
        pub fn new() -> Self {
            Self(pb::GenerateRequest {
                model: "base".into(),
                ..Default::default()
            })
        }
        pub fn msg(mut self, m: pb::Message) -> Self {
            self.0.messages.push(m);
            self
        }
        pub fn build(self) -> pb::GenerateRequest {
            self.0
        }
    }
}
