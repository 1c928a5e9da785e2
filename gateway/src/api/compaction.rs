//! The content of a `compaction` item (`encrypted_content`): the summary
//! `POST /v1/responses/compact` wrote, in this service's encoding. It is
//! sealed only against misreading, not encrypted: the client wrote the
//! conversation it summarises, so there is nothing in it to hide from that
//! client (docs/request-contract.md says so).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// Marks (and versions) this service's compaction content.
const SEAL: &str = "igw.c1.";

/// The `encrypted_content` of a compaction item holding `summary`.
pub fn seal(summary: &str) -> String {
    format!("{SEAL}{}", URL_SAFE_NO_PAD.encode(summary.as_bytes()))
}

/// The summary in a compaction item's `encrypted_content`; `None` if this
/// service did not write it.
pub fn open(content: &str) -> Option<String> {
    let encoded = content.strip_prefix(SEAL)?;
    let bytes = URL_SAFE_NO_PAD.decode(encoded).ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_summary_opens_to_itself() {
        let summary = "User wants a landing page; index.html written. Ünïcode ✓";
        let sealed = seal(summary);
        assert!(sealed.starts_with(SEAL));
        assert!(!sealed.contains("landing"), "not readable as is");
        assert_eq!(open(&sealed).as_deref(), Some(summary));
    }

    #[test]
    fn content_this_gateway_did_not_write_does_not_open() {
        assert_eq!(open("gAAAAABpM0Yj-...="), None, "another provider's");
        assert_eq!(open("igw.c1.!!!"), None, "not base64");
        assert_eq!(
            open(&format!("{SEAL}{}", URL_SAFE_NO_PAD.encode([0xff, 0xfe]))),
            None,
            "not UTF-8"
        );
    }
}
