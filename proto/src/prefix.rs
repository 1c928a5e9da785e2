//! A request's prompt prefix as chained block hashes: the one definition
//! the gateway (routing) and the worker (its cache report, `PrefixCache`)
//! share, so a hash the gateway computes means the same bytes as one a
//! worker reports.
//!
//! The hashes cover a canonical encoding of the request's tools and
//! messages, not the engine's tokens: the gateway then needs neither the
//! model's tokenizer nor its chat template, nor a tokenize call per
//! request. A template renders the same messages to the same text, so an
//! engine holding a prompt's tokens holds the text of every whole block of
//! its encoding. Block `i`'s hash covers every byte up to its end (the
//! previous hash is chained in), so one hash names a whole prefix and two
//! prompts share block hashes exactly as far as they share a head.

use crate::v1 as pb;

/// Bytes of canonical encoding per block (about 32 tokens of English).
pub const BLOCK_BYTES: usize = 128;

/// Blocks hashed at most per prompt (256 KiB): routing needs the head of a
/// prompt, and a huge one (inline images) must not cost more than that.
pub const MAX_BLOCKS: usize = 2048;

// Separators that do not occur in the fields they delimit (ASCII control
// codes for file, group, record and unit), so that moving bytes between
// fields changes the encoding.
const TOOL: u8 = 0x1c;
const PART: u8 = 0x1d;
const MESSAGE: u8 = 0x1e;
const FIELD: u8 = 0x1f;

/// The chained hashes of the whole blocks of `request`'s prompt (tools,
/// then messages), at most [`MAX_BLOCKS`]. A prompt shorter than one block
/// has none.
pub fn prompt_blocks(request: &pb::GenerateRequest) -> Vec<u64> {
    let mut chain = Chain::default();
    for tool in &request.tools {
        chain.push(&[TOOL]);
        chain.push(tool.name.as_bytes());
        chain.push(&[FIELD]);
        chain.push(tool.description.as_bytes());
        chain.push(&[FIELD]);
        chain.push(tool.parameters_json.as_bytes());
    }
    for message in &request.messages {
        if chain.full() {
            break;
        }
        chain.push(&[MESSAGE]);
        chain.push(message.role.as_bytes());
        chain.push(&[FIELD]);
        chain.push(message.name.as_bytes());
        chain.push(&[FIELD]);
        chain.push(message.tool_call_id.as_bytes());
        chain.push(&[FIELD]);
        for part in &message.content {
            match &part.part {
                Some(pb::content_part::Part::Text(text)) => chain.push(text.as_bytes()),
                Some(pb::content_part::Part::ImageUrl(image)) => {
                    chain.push(&[PART]);
                    chain.push(image.url.as_bytes());
                    chain.push(&[PART]);
                }
                None => {}
            }
        }
        for call in &message.tool_calls {
            chain.push(&[PART]);
            chain.push(call.name.as_bytes());
            chain.push(&[FIELD]);
            chain.push(call.arguments.as_bytes());
        }
    }
    chain.blocks
}

/// How many leading blocks of `blocks` satisfy `held`: the prefix an
/// engine holding exactly those hashes would reuse.
pub fn matched_blocks(blocks: &[u64], mut held: impl FnMut(u64) -> bool) -> usize {
    blocks.iter().take_while(|&&h| held(h)).count()
}

/// Cuts bytes into blocks and chains their hashes: each block's 8-byte
/// words are mixed into the previous block's hash (a multiply-xorshift per
/// word, about eight times fewer steps than a hash per byte). Not a
/// cryptographic hash: a collision only misroutes a request.
struct Chain {
    blocks: Vec<u64>,
    hash: u64,
    block: [u8; BLOCK_BYTES],
    filled: usize,
}

const SEED: u64 = 0xcbf2_9ce4_8422_2325;
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl Default for Chain {
    fn default() -> Self {
        Self {
            blocks: Vec::new(),
            hash: SEED,
            block: [0; BLOCK_BYTES],
            filled: 0,
        }
    }
}

impl Chain {
    fn full(&self) -> bool {
        self.blocks.len() >= MAX_BLOCKS
    }

    fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.full() {
            let take = (BLOCK_BYTES - self.filled).min(bytes.len());
            self.block[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == BLOCK_BYTES {
                // Seeded with the previous hash: it names the whole prefix.
                let mut h = self.hash;
                for word in self.block.chunks_exact(8) {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(word);
                    h = (h ^ u64::from_le_bytes(w)).wrapping_mul(MIX);
                    h ^= h >> 29;
                }
                self.hash = h;
                self.blocks.push(h);
                self.filled = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, text: &str) -> pb::Message {
        pb::Message {
            role: role.into(),
            content: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text(text.into())),
            }],
            ..Default::default()
        }
    }

    fn request(messages: Vec<pb::Message>) -> pb::GenerateRequest {
        pb::GenerateRequest {
            messages,
            ..Default::default()
        }
    }

    #[test]
    fn prompts_share_blocks_exactly_as_far_as_they_share_a_head() {
        let system = "You are the support assistant of a bicycle shop. ".repeat(10);
        let a = prompt_blocks(&request(vec![
            message("system", &system),
            message("user", &"Where is my order? ".repeat(20)),
        ]));
        let b = prompt_blocks(&request(vec![
            message("system", &system),
            message("user", &"Do you repair e-bikes? ".repeat(20)),
        ]));
        // Both encodings agree up to the user text: the system message, its
        // separators and the user message's head (`\x1euser\x1f\x1f\x1f`).
        let head = (1 + "system".len() + 3 + system.len() + 1 + "user".len() + 3) / BLOCK_BYTES;
        assert!(a.len() > head && b.len() > head);
        assert_eq!(a[..head], b[..head]);
        assert_ne!(a[head], b[head]);
        assert_eq!(matched_blocks(&b, |h| a.contains(&h)), head);
    }

    #[test]
    fn a_conversation_extends_its_previous_turn() {
        let turn1 = vec![
            message("system", &"Be brief. ".repeat(30)),
            message("user", &"Tell me about tides. ".repeat(10)),
        ];
        let mut turn2 = turn1.clone();
        turn2.push(message("assistant", &"Tides follow the moon. ".repeat(10)));
        turn2.push(message("user", "And spring tides?"));
        let first = prompt_blocks(&request(turn1));
        let second = prompt_blocks(&request(turn2));
        assert!(!first.is_empty());
        assert_eq!(second[..first.len()], first[..]);
    }

    #[test]
    fn role_and_tools_are_part_of_the_prefix() {
        let text = "x".repeat(4 * BLOCK_BYTES);
        let user = prompt_blocks(&request(vec![message("user", &text)]));
        let system = prompt_blocks(&request(vec![message("system", &text)]));
        assert_ne!(user[0], system[0]);
        let mut with_tool = request(vec![message("user", &text)]);
        with_tool.tools.push(pb::FunctionTool {
            name: "lookup".into(),
            ..Default::default()
        });
        assert_ne!(prompt_blocks(&with_tool)[0], user[0]);
    }

    #[test]
    fn short_prompts_have_no_blocks_and_huge_ones_are_capped() {
        assert!(prompt_blocks(&request(vec![message("user", "hi")])).is_empty());
        let huge = "y".repeat(BLOCK_BYTES * (MAX_BLOCKS + 10));
        assert_eq!(
            prompt_blocks(&request(vec![message("user", &huge)])).len(),
            MAX_BLOCKS
        );
    }
}
