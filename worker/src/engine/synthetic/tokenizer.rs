//! The simulator's chat template and tokenizer: a real BPE (o200k_base,
//! embedded in `tiktoken-rs`, so nothing downloads) over a small template.
//!
//! The template renders every message as `<|start|>role<|sep|>content<|end|>`
//! (a tool result's role line also names the call it answers:
//! `tool (call_id)`), then `<|start|>assistant<|sep|>` to open the reply. So
//! every message costs its content plus four tokens (three framing tokens and
//! the role). The framing markers tokenize to ids above the o200k vocabulary,
//! so they never collide with text; they are parsed wherever they appear in
//! the text, as a model's special tokens are.
//!
//! Images are not fetched. Each image part costs a documented fixed amount
//! (see [`image_tokens`]): the template writes `<|image:N:HASH|>`, which
//! tokenizes to N copies of a token derived from the image URL, so two
//! different images never share a cached prefix and `prompt_tokens` is
//! simply the sequence length.
//!
//! [`decode`] turns a prompt back into its text (an image into
//! [`IMAGE_PLACEHOLDER`]), which is what the simulator plans its reply from.

use super::rng::WORDS;
use crate::seam::sequence::{ChatMessage, Image, IMAGE_PLACEHOLDER};
use crate::seam::tokens::{fnv1a, saturate};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use tiktoken_rs::{o200k_base_singleton, CoreBPE, Rank};

/// Opens a message.
pub const START: &str = "<|start|>";
/// Ends a message's role line.
pub const SEP: &str = "<|sep|>";
/// Ends a message.
pub const END: &str = "<|end|>";
const IMAGE_OPEN: &str = "<|image:";
const MARKER_CLOSE: &str = "|>";

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

/// Renders messages with the template, ending with the reply opened.
pub fn render(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str(START);
        out.push_str(&m.role);
        if !m.tool_call_id.is_empty() {
            out.push_str(&format!(" ({})", m.tool_call_id));
        }
        out.push_str(SEP);
        let mut images = m.images.iter();
        for c in m.content.chars() {
            match (c == IMAGE_PLACEHOLDER).then(|| images.next()).flatten() {
                Some(image) => out.push_str(&image_marker(image)),
                None => out.push(c),
            }
        }
        out.push_str(END);
    }
    out.push_str(START);
    out.push_str("assistant");
    out.push_str(SEP);
    out
}

fn image_marker(image: &Image) -> String {
    let hash = fnv1a(image.url.as_bytes()) & 0x00ff_ffff;
    format!(
        "{IMAGE_OPEN}{}:{hash:06x}{MARKER_CLOSE}",
        image_tokens(&image.detail)
    )
}

/// The tokens of the template's marker at the start of `text`, and its
/// length in bytes.
fn marker(text: &str) -> Option<(Vec<Rank>, usize)> {
    for (m, id) in [(START, MSG_START), (SEP, MSG_SEP), (END, MSG_END)] {
        if text.starts_with(m) {
            return Some((vec![id], m.len()));
        }
    }
    let rest = text.strip_prefix(IMAGE_OPEN)?;
    let close = rest.find(MARKER_CLOSE)?;
    let (n, hash) = rest[..close].split_once(':')?;
    let n: usize = n.parse().ok()?;
    let hash = Rank::from_str_radix(hash, 16).ok()? & 0x00ff_ffff;
    Some((
        vec![IMAGE_BASE + hash; n],
        IMAGE_OPEN.len() + close + MARKER_CLOSE.len(),
    ))
}

/// Tokenizes rendered text: the template's markers to their own tokens,
/// the text between them with o200k.
pub fn tokenize(text: &str) -> Vec<Rank> {
    let mut out = Vec::new();
    let encode = |out: &mut Vec<Rank>, s: &str| {
        if !s.is_empty() {
            encode_segment(out, s);
        }
    };
    let (mut at, mut text_from) = (0, 0);
    while let Some(off) = text[at..].find("<|") {
        let here = at + off;
        match marker(&text[here..]) {
            Some((tokens, len)) => {
                encode(&mut out, &text[text_from..here]);
                out.extend(tokens);
                at = here + len;
                text_from = at;
            }
            None => at = here + 2,
        }
    }
    encode(&mut out, &text[text_from..]);
    out
}

/// Segments (a role, a message's text) up to this many bytes are
/// remembered once encoded.
const MEMO_SEGMENT_BYTES: usize = 4096;
/// Segments remembered at most; the memo starts over when full.
const MEMO_SEGMENTS: usize = 4096;

/// Encodes one segment between template markers. o200k's pre-tokenizer
/// (a backtracking regex) costs microseconds per message, more than the
/// rest of a simulated request, and prompts repeat their system prompts and
/// roles: short segments are encoded once.
fn encode_segment(out: &mut Vec<Rank>, segment: &str) {
    type Memo = Mutex<HashMap<Box<str>, Arc<[Rank]>>>;
    static MEMO: OnceLock<Memo> = OnceLock::new();
    if segment.len() > MEMO_SEGMENT_BYTES {
        out.extend(bpe().encode_ordinary(segment));
        return;
    }
    let memo = MEMO.get_or_init(Mutex::default);
    let lock = || match memo.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some(ids) = lock().get(segment).cloned() {
        out.extend_from_slice(&ids);
        return;
    }
    let ids: Arc<[Rank]> = bpe().encode_ordinary(segment).into();
    out.extend_from_slice(&ids);
    let mut memo = lock();
    if memo.len() >= MEMO_SEGMENTS {
        memo.clear();
    }
    memo.insert(segment.into(), ids);
}

/// A prompt's text again: markers as the template writes them, each run of
/// one image's tokens as [`IMAGE_PLACEHOLDER`].
pub fn decode(tokens: &[Rank]) -> String {
    let bpe = bpe();
    let mut out = String::new();
    let mut ordinary: Vec<Rank> = Vec::new();
    let flush = |out: &mut String, ordinary: &mut Vec<Rank>| {
        if !ordinary.is_empty() {
            let bytes = bpe.decode_bytes(ordinary).unwrap_or_default();
            out.push_str(&String::from_utf8_lossy(&bytes));
            ordinary.clear();
        }
    };
    let mut last_image = None;
    for &t in tokens {
        if t < MSG_START {
            last_image = None;
            ordinary.push(t);
            continue;
        }
        flush(&mut out, &mut ordinary);
        if t >= IMAGE_BASE {
            if last_image != Some(t) {
                out.push(IMAGE_PLACEHOLDER);
            }
            last_image = Some(t);
            continue;
        }
        last_image = None;
        match t {
            MSG_START => out.push_str(START),
            MSG_SEP => out.push_str(SEP),
            MSG_END => out.push_str(END),
            _ => {}
        }
    }
    flush(&mut out, &mut ordinary);
    out
}

/// One token of output: its id and its bytes (possibly part of a
/// character).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: Rank,
    pub bytes: Vec<u8>,
}

/// Text as o200k tokens; their bytes concatenate to the text exactly.
pub fn tokens(text: &str) -> Vec<Token> {
    let bpe = bpe();
    bpe.encode_ordinary(text)
        .into_iter()
        .map(|id| Token {
            id,
            bytes: bpe.decode_bytes(&[id]).unwrap_or_default(),
        })
        .collect()
}

/// One token standing for `text` (a word of the simulator's list, each a
/// single o200k token).
pub fn token(text: &str) -> Token {
    let id = match word_ids().get(text) {
        Some(id) => *id,
        None => first_id(text),
    };
    Token {
        id,
        bytes: text.as_bytes().to_vec(),
    }
}

fn first_id(text: &str) -> Rank {
    bpe().encode_ordinary(text).first().copied().unwrap_or(0)
}

/// The ids of the word list (with and without the leading space) and of
/// ".", encoded once: every reply is made of them, and o200k's
/// pre-tokenizer costs a microsecond a word.
fn word_ids() -> &'static HashMap<&'static str, Rank> {
    static IDS: OnceLock<HashMap<&'static str, Rank>> = OnceLock::new();
    IDS.get_or_init(|| {
        WORDS
            .iter()
            .flat_map(|w| [*w, w.trim_start()])
            .chain(["."])
            .map(|w| (w, first_id(w)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
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
        let one = tokenize(&render(&[msg("user", "hello world")]));
        // 2 content + start, "user", sep, end + start, "assistant", sep.
        assert_eq!(one.len(), 2 + 4 + 3);
        let two = tokenize(&render(&[
            msg("user", "hello world"),
            msg("user", "hello world"),
        ]));
        assert_eq!(two.len(), 2 * (2 + 4) + 3);
    }

    #[test]
    fn images_cost_a_fixed_documented_amount() {
        let mut m = msg("user", "look");
        for detail in ["low", "high", "auto"] {
            m.content.push(IMAGE_PLACEHOLDER);
            m.images.push(Image {
                url: format!("https://example.com/{detail}.png"),
                detail: detail.into(),
            });
        }
        let tokens = tokenize(&render(&[m]));
        assert_eq!(tokens.len(), 1 + 4 + 3 + 85 + 765 + 765);
        let back = decode(&tokens);
        assert_eq!(back.matches(IMAGE_PLACEHOLDER).count(), 3, "{back}");
    }

    #[test]
    fn decode_gives_the_rendered_text_back() {
        let text = render(&[
            msg("system", "naïve café — 日本語 🎉 <|not a marker|>"),
            ChatMessage {
                tool_call_id: "call_1".into(),
                ..msg("tool", "12:00")
            },
        ]);
        assert!(text.contains("<|start|>tool (call_1)<|sep|>12:00<|end|>"));
        assert_eq!(decode(&tokenize(&text)), text);
    }

    #[test]
    fn tokens_concatenate_to_the_input_and_count_as_bpe() {
        for text in [
            "hello world",
            "naïve café — 日本語のテキスト 🎉🎉",
            "{\"a\": [1, 2]}",
        ] {
            let ts = tokens(text);
            let joined: Vec<u8> = ts.iter().flat_map(|t| t.bytes.clone()).collect();
            assert_eq!(joined, text.as_bytes());
            assert_eq!(saturate(ts.len()), count(text));
        }
    }
}
