//! Random ids the planner mints: a leaf every room may use.

/// `prefix` + 24 random alphanumerics: ids of tool calls, A2A messages
/// and requests, lock tokens.
pub fn new_id(prefix: &str) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    Alphanumeric.append_string(&mut rand::rng(), &mut id, 24);
    id
}
