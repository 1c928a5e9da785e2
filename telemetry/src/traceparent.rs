//! The W3C Trace Context `traceparent` header:
//! `VERSION-TRACE_ID-PARENT_ID-FLAGS`, e.g.
//! `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use std::fmt;

/// A valid trace context: non-zero trace and span ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: u128,
    /// The id of the span the receiver's work is a child of.
    pub span_id: u64,
    /// Bit 0: sampled.
    pub flags: u8,
}

/// Length of a version-00 header.
const LEN: usize = 55;

impl TraceParent {
    /// Parses a header value. Follows the W3C rules: lowercase hex, version
    /// `ff` invalid, version `00` exactly 55 characters, a later version
    /// may append `-...` fields (ignored); all-zero ids are invalid.
    pub fn parse(value: &[u8]) -> Option<Self> {
        let value = value.trim_ascii();
        if value.len() < LEN {
            return None;
        }
        let version = hex_u8(&value[0..2])?;
        if version == 0xff
            || (version == 0 && value.len() != LEN)
            || (value.len() > LEN && value[LEN] != b'-')
        {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let trace_id = hex_u128(&value[3..35])?;
        let span_id = u64::try_from(hex_u128(&value[36..52])?).ok()?;
        let flags = hex_u8(&value[53..55])?;
        if trace_id == 0 || span_id == 0 {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// A new trace, sampled.
    pub fn new_root() -> Self {
        Self {
            trace_id: nonzero_u128(),
            span_id: nonzero_u64(),
            flags: 1,
        }
    }

    /// The same trace and flags with a fresh span id: the context of work
    /// done on behalf of `self`.
    pub fn child(&self) -> Self {
        Self {
            span_id: nonzero_u64(),
            ..*self
        }
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The trace id as 32 lowercase hex digits (as logged and exported).
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// The header value (version 00).
    pub fn to_header(&self) -> String {
        self.to_string()
    }

    pub(crate) fn from_span_context(sc: &SpanContext) -> Self {
        Self {
            trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
            span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
            flags: sc.trace_flags().to_u8(),
        }
    }

    /// An OpenTelemetry context whose (remote) parent span is this one.
    pub(crate) fn otel_context(&self) -> opentelemetry::Context {
        let sc = SpanContext::new(
            TraceId::from_bytes(self.trace_id.to_be_bytes()),
            SpanId::from_bytes(self.span_id.to_be_bytes()),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        );
        opentelemetry::Context::new().with_remote_span_context(sc)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex_u128(digits: &[u8]) -> Option<u128> {
    digits
        .iter()
        .try_fold(0u128, |acc, &b| Some(acc << 4 | u128::from(hex_digit(b)?)))
}

fn hex_u8(digits: &[u8]) -> Option<u8> {
    u8::try_from(hex_u128(digits)?).ok()
}

fn nonzero_u128() -> u128 {
    loop {
        let v: u128 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

fn nonzero_u64() -> u64 {
    loop {
        let v: u64 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_formats_the_spec_example() {
        let p = TraceParent::parse(EXAMPLE.as_bytes()).expect("valid");
        assert_eq!(p.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(p.span_id, 0x00f067aa0ba902b7);
        assert_eq!(p.flags, 1);
        assert!(p.sampled());
        assert_eq!(p.to_header(), EXAMPLE);
        assert_eq!(p.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        // Surrounding whitespace (optional whitespace in a header) is fine.
        assert_eq!(
            TraceParent::parse(format!(" {EXAMPLE}\t").as_bytes()),
            Some(p)
        );
    }

    #[test]
    fn rejects_invalid_values() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            // Uppercase hex.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            // All-zero ids.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Version ff, and version 00 with trailing fields.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            // Wrong separators and non-hex.
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for value in bad {
            assert_eq!(TraceParent::parse(value.as_bytes()), None, "{value:?}");
        }
    }

    #[test]
    fn later_versions_may_append_fields() {
        let v = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future";
        let p = TraceParent::parse(v.as_bytes()).expect("valid");
        assert!(!p.sampled());
        assert_eq!(
            p.to_header(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
        assert_eq!(
            TraceParent::parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00x"),
            None
        );
    }

    #[test]
    fn new_roots_and_children_round_trip() {
        let root = TraceParent::new_root();
        assert!(root.sampled());
        let header = root.to_header();
        assert_eq!(header.len(), 55);
        assert_eq!(TraceParent::parse(header.as_bytes()), Some(root));
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_ne!(TraceParent::new_root().trace_id, root.trace_id);
    }

    #[test]
    fn converts_to_and_from_otel_span_contexts() {
        let p = TraceParent::parse(EXAMPLE.as_bytes()).expect("valid");
        let cx = p.otel_context();
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(TraceParent::from_span_context(&sc), p);
    }
}
