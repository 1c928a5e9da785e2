//! Stop strings across token boundaries: text that could be the start of a
//! stop string is held back until it is known not to be one.
//!
//! The scan is one Aho-Corasick automaton over the stop strings' bytes,
//! built once per request and stepped once per output byte, so a reply
//! costs time linear in its length whatever the stop strings are (the
//! previous scan searched the held text for every stop string on every
//! token: milliseconds per token with megabyte stop strings). The
//! automaton's state says exactly how much text to hold back: the longest
//! end of the output that begins a stop string. Its own crate's
//! automaton does not expose that depth, hence these few lines.
//!
//! The text ends before the first stop string to complete; of two that
//! complete on the same byte, before the longer. That depends only on the
//! text, never on where tokens split it.

use crate::status;
use inference_proto::limits::{MAX_STOPS, MAX_STOP_BYTES};
use std::collections::VecDeque;
use tonic::Status;

/// What one push released.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Text safe to emit (never includes a stop string or what follows it).
    pub text: String,
    /// A stop string was found (its index in the request's list): the
    /// text ends just before it.
    pub stopped: Option<u32>,
}

/// Refuses stop strings over the protocol's bounds, whichever gateway sent
/// them: the automaton costs memory in proportion to their bytes.
pub fn check(stops: &[String]) -> Result<(), Status> {
    if stops.len() > MAX_STOPS {
        return Err(status::invalid_request(format!(
            "at most {MAX_STOPS} stop strings are allowed, got {}",
            stops.len()
        )));
    }
    if let Some((i, s)) = stops
        .iter()
        .enumerate()
        .find(|(_, s)| s.len() > MAX_STOP_BYTES)
    {
        return Err(status::invalid_request(format!(
            "stop string {i} has {} bytes; at most {MAX_STOP_BYTES} are allowed",
            s.len()
        )));
    }
    Ok(())
}

/// Scans streamed text for the request's stop strings.
#[derive(Debug, Default)]
pub struct StopScanner {
    /// `None` without stop strings: text passes straight through. Boxed:
    /// a scanner lives in every phase's state, most of them without stops.
    automaton: Option<Box<Automaton>>,
    state: u32,
    /// The end of the text that begins a stop string (the state's depth),
    /// not released yet.
    held: VecDeque<u8>,
}

impl StopScanner {
    pub fn new(stops: &[String]) -> Self {
        let stops: Vec<(u32, &[u8])> = (0u32..)
            .zip(stops)
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i, s.as_bytes()))
            .collect();
        Self {
            automaton: (!stops.is_empty()).then(|| Box::new(Automaton::new(&stops))),
            state: ROOT,
            held: VecDeque::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Scan {
        let Some(a) = &self.automaton else {
            return Scan {
                text: text.to_owned(),
                stopped: None,
            };
        };
        let bytes = text.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            self.state = a.next(self.state, b);
            let matched = a.matched[self.state as usize] as usize;
            if matched > 0 {
                // The match ends with byte `i`; the text ends where it starts.
                self.held.extend(&bytes[..=i]);
                self.held.truncate(self.held.len() - matched);
                let which = a.which[self.state as usize];
                self.state = ROOT;
                return Scan {
                    text: utf8(self.held.drain(..).collect()),
                    stopped: Some(which),
                };
            }
        }
        // Release all but the end that may still begin a stop string. Every
        // byte enters and leaves `held` once: linear in the text.
        self.held.extend(bytes);
        let cut = self.held.len() - a.depth[self.state as usize] as usize;
        Scan {
            text: utf8(self.held.drain(..cut).collect()),
            stopped: None,
        }
    }

    /// The held text, once the stream ended without a stop.
    pub fn flush(&mut self) -> String {
        self.state = ROOT;
        utf8(self.held.drain(..).collect())
    }
}

/// Released text as a string. Cuts fall on character boundaries (a stop
/// string starts with a character's first byte, which in valid UTF-8 text
/// starts a character), so this never replaces anything.
fn utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

const ROOT: u32 = 0;

/// The Aho-Corasick automaton of the stop strings: their trie (edges in
/// one sorted array per state, `first[s]..first[s + 1]`), failure links
/// and, per state, its depth and the longest stop string ending there.
#[derive(Debug, Default)]
struct Automaton {
    first: Vec<u32>,
    edges: Vec<(u8, u32)>,
    fail: Vec<u32>,
    depth: Vec<u32>,
    /// Length of the longest stop string that ends at this state (itself
    /// or through its failure links); 0 for none.
    matched: Vec<u32>,
    /// That stop string's index in the request's list.
    which: Vec<u32>,
}

impl Automaton {
    /// The automaton of `stops`, each with its index in the request's list.
    fn new(stops: &[(u32, &[u8])]) -> Self {
        // The trie, with edges per state while it grows.
        let mut children: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut depth = vec![0u32];
        let mut own = vec![0u32];
        let mut which = vec![0u32];
        for &(index, stop) in stops {
            let mut s = ROOT as usize;
            for &b in stop {
                s = match children[s].iter().find(|(c, _)| *c == b) {
                    Some(&(_, t)) => t as usize,
                    None => {
                        let t = children.len();
                        children[s].push((b, t as u32));
                        children.push(Vec::new());
                        depth.push(depth[s] + 1);
                        own.push(0);
                        which.push(0);
                        t
                    }
                };
            }
            // Of two equal stop strings, the first is named.
            if own[s] == 0 {
                own[s] = stop.len() as u32;
                which[s] = index;
            }
        }
        let mut a = Automaton {
            first: Vec::with_capacity(children.len() + 1),
            edges: Vec::new(),
            fail: vec![ROOT; children.len()],
            depth,
            matched: own,
            which,
        };
        for mut c in children {
            c.sort_unstable_by_key(|(b, _)| *b);
            a.first.push(a.edges.len() as u32);
            a.edges.extend(c);
        }
        a.first.push(a.edges.len() as u32);
        // Failure links breadth first: a state's link is shallower, so it
        // is final when the state is reached.
        let mut queue = VecDeque::from([ROOT]);
        while let Some(s) = queue.pop_front() {
            for i in a.first[s as usize]..a.first[s as usize + 1] {
                let (b, t) = a.edges[i as usize];
                let link = if s == ROOT {
                    ROOT
                } else {
                    a.next(a.fail[s as usize], b)
                };
                a.fail[t as usize] = link;
                // A stop string ending at `t` itself is the longest there.
                if a.matched[t as usize] == 0 {
                    a.matched[t as usize] = a.matched[link as usize];
                    a.which[t as usize] = a.which[link as usize];
                }
                queue.push_back(t);
            }
        }
        a
    }

    fn edge(&self, s: u32, b: u8) -> Option<u32> {
        let edges =
            &self.edges[self.first[s as usize] as usize..self.first[s as usize + 1] as usize];
        edges
            .binary_search_by_key(&b, |(c, _)| *c)
            .ok()
            .map(|i| edges[i].1)
    }

    /// The state after `b`. Amortized constant: each failure step makes
    /// the state shallower, and each byte deepens it by one at most.
    fn next(&self, mut s: u32, b: u8) -> u32 {
        loop {
            if let Some(t) = self.edge(s, b) {
                return t;
            }
            if s == ROOT {
                return ROOT;
            }
            s = self.fail[s as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopScanner::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let scan = s.push(p);
            out.push_str(&scan.text);
            if scan.stopped.is_some() {
                return (out, true);
            }
        }
        out.push_str(&s.flush());
        (out, false)
    }

    #[test]
    fn a_stop_split_across_tokens_ends_the_text_before_it() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D and more"]),
            ("hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn a_false_start_is_released() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "x"]),
            ("hello ENx".into(), false)
        );
        assert_eq!(run(&["END"], &["EN"]), ("EN".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
        assert_eq!(run(&[], &["abc"]), ("abc".into(), false));
        // Ending on the same byte, the longer one wins.
        assert_eq!(run(&["b", "xab"], &["xxab"]), ("x".into(), true));
    }

    #[test]
    fn multibyte_text_is_held_on_char_boundaries() {
        assert_eq!(run(&["日本"], &["x日", "本y"]), ("x".into(), true));
        assert_eq!(run(&["é!"], &["aé", "b"]), ("aéb".into(), false));
    }

    #[test]
    fn only_what_may_begin_a_stop_is_held() {
        let stops = vec!["abcd".to_string(), "bce".to_string()];
        let mut s = StopScanner::new(&stops);
        assert_eq!(s.push("xxab").text, "xx");
        // After "abcx" nothing may begin a stop string.
        assert_eq!(s.push("cx").text, "abcx");
        assert_eq!(s.push("yb").text, "y");
        assert_eq!(s.push("c").text, "");
        let end = s.push("e!");
        assert_eq!((end.text.as_str(), end.stopped), ("", Some(1)));
    }

    /// The stop string that ended the text is named by its index in the
    /// request's list (empty ones skipped but counted; of two equal ones,
    /// the first), also when it completes through a failure link.
    #[test]
    fn the_stop_that_ended_the_text_is_named() {
        let which = |stops: &[&str], text: &str| {
            let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
            StopScanner::new(&stops).push(text).stopped
        };
        assert_eq!(which(&["", "END", "x"], "abc END"), Some(1));
        assert_eq!(which(&["zzz", "ab", "ab"], "xxab"), Some(1));
        // "abcd" almost matches; "bcx" completes through its failure link.
        assert_eq!(which(&["abcd", "bcx"], "abcx"), Some(1));
        assert_eq!(which(&["b", "xab"], "xxab"), Some(1));
        assert_eq!(which(&["q"], "abc"), None);
    }

    /// The scan agrees with a plain search of the whole text, however the
    /// text is cut into tokens (seeded, over a small alphabet so stops
    /// overlap and almost match often).
    #[test]
    fn any_split_gives_the_answer_of_a_whole_text_search() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let alphabet = ["a", "b", "é", "日"];
        let word = |rand: &mut dyn FnMut(usize) -> usize, len: usize| -> String {
            (0..len).map(|_| alphabet[rand(alphabet.len())]).collect()
        };
        for _ in 0..2000 {
            let mut stops = Vec::new();
            for _ in 0..1 + rand(4) {
                let len = 1 + rand(4);
                stops.push(word(&mut rand, len));
            }
            let len = rand(40);
            let text = word(&mut rand, len);
            // Reference: the first stop to complete, the longer on a tie.
            let expected = (0..=text.len())
                .filter(|&end| text.is_char_boundary(end))
                .find_map(|end| {
                    stops
                        .iter()
                        .filter(|s| text[..end].ends_with(s.as_str()))
                        .map(|s| s.len())
                        .max()
                        .map(|len| (text[..end - len].to_string(), true))
                })
                .unwrap_or_else(|| (text.clone(), false));
            let mut pieces = Vec::new();
            let mut rest = text.as_str();
            while !rest.is_empty() {
                let mut cut = (1 + rand(6)).min(rest.len());
                while !rest.is_char_boundary(cut) {
                    cut += 1;
                }
                pieces.push(&rest[..cut]);
                rest = &rest[cut..];
            }
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            assert_eq!(
                run(&stop_refs, &pieces),
                expected,
                "stops {stops:?}, pieces {pieces:?}"
            );
        }
    }

    /// The audit's stop strings were 4 MB each: the old scan searched the
    /// held text for each on every token (milliseconds a token). Now a
    /// token costs the same whatever the stop strings: 20,000 one-byte
    /// tokens that keep almost matching four 64 KiB stop strings.
    #[test]
    fn the_scan_is_linear_in_the_text_whatever_the_stops() {
        let stops: Vec<String> = ["q", "x", "y", "z"]
            .iter()
            .map(|c| format!("{}!", c.repeat(64 << 10)))
            .collect();
        let started = std::time::Instant::now();
        let mut s = StopScanner::new(&stops);
        let built = started.elapsed();
        let mut out = 0;
        for _ in 0..20_000 {
            out += s.push("q").text.len();
        }
        let scanned = started.elapsed() - built;
        println!(
            "automaton of 4 × 64 KiB built in {built:?}; 20,000 tokens scanned in {scanned:?}"
        );
        // Everything but what may still begin "qqq…!" was released.
        assert_eq!(out + s.flush().len(), 20_000);
        assert!(
            scanned < std::time::Duration::from_millis(200),
            "{scanned:?}"
        );
    }

    #[test]
    fn stop_strings_over_the_protocol_bounds_are_refused() {
        let ok = vec!["é".repeat(MAX_STOP_BYTES / 2); MAX_STOPS];
        assert!(check(&ok).is_ok());
        let long = vec!["a".into(), "x".repeat(MAX_STOP_BYTES + 1)];
        let e = check(&long).unwrap_err();
        assert_eq!(status::reason_of(&e), Some("INVALID_REQUEST"));
        assert!(e.message().contains("stop string 1"), "{}", e.message());
        let many = vec!["a".to_string(); MAX_STOPS + 1];
        assert_eq!(
            status::reason_of(&check(&many).unwrap_err()),
            Some("INVALID_REQUEST")
        );
    }
}
