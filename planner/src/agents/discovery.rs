//! Discovery: which directory agents match a request's words (their
//! cards' names, descriptions and skills), and the plan ids made from
//! cards' names.

use crate::a2a::AgentCard;
use std::collections::BTreeSet;

/// A plan id from a card's name: lowercase letters, digits and dashes.
pub fn slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
        if s.len() >= 40 {
            break;
        }
    }
    let s = s.trim_end_matches('-').to_owned();
    if s.is_empty() {
        "agent".into()
    } else {
        s
    }
}

pub(super) fn unique_id(base: &str, taken: &mut BTreeSet<String>) -> String {
    let mut id = base.to_owned();
    let mut n = 2;
    while taken.contains(&id) {
        id = format!("{base}-{n}");
        n += 1;
    }
    taken.insert(id.clone());
    id
}

const STOPWORDS: [&str; 24] = [
    "the",
    "and",
    "for",
    "with",
    "that",
    "this",
    "what",
    "please",
    "from",
    "into",
    "about",
    "your",
    "you",
    "are",
    "can",
    "will",
    "how",
    "give",
    "get",
    "tell",
    "use",
    "all",
    "then",
    "synthetic",
];

/// The distinct content words of a text.
pub(super) fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 3 && !STOPWORDS.contains(&w.as_str()))
        .collect()
}

/// How many of the request's words the card mentions.
pub(super) fn score(query: &BTreeSet<String>, card: &AgentCard) -> usize {
    let mut text = format!("{} {}", card.name, card.description);
    for s in &card.skills {
        text.push(' ');
        text.push_str(&s.name);
        text.push(' ');
        text.push_str(&s.description);
        for t in &s.tags {
            text.push(' ');
            text.push_str(t);
        }
    }
    let card_words = words(&text);
    query.intersection(&card_words).count()
}
