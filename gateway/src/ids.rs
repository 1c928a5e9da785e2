//! Public ids: `chatcmpl-…`, `resp_…`, `msg_…`, request ids, tool-call ids.
//! Below every layer (it imports nothing of the gateway).

/// `prefix` + 24 random alphanumerics.
pub fn new_id(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    for _ in 0..24 {
        id.push(ALPHABET[rng.random_range(0..ALPHABET.len())] as char);
    }
    id
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_the_prefix_and_24_alphanumerics() {
        let id = super::new_id("resp_");
        assert_eq!(id.len(), 5 + 24);
        assert!(id.starts_with("resp_"));
        assert!(id[5..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(super::new_id("resp_"), id);
    }
}
