//! The `x-ratelimit-*` headers every generation response carries once it
//! has been through admission: limit, remaining and reset, for requests and
//! for tokens, in the form the widely used API sends (`1s`, `6m0s`, `12ms`).
//! A limit the plan leaves unlimited gets no headers.

use super::store::{Admission, Verdict};
use crate::accounts::RatePlan;

pub fn rate_limit_headers(plan: &RatePlan, a: &Admission) -> Vec<(&'static str, String)> {
    let mut h = Vec::with_capacity(6);
    if plan.rpm > 0 {
        let limit = u64::from(plan.rpm);
        h.push(("x-ratelimit-limit-requests", int(limit)));
        h.push((
            "x-ratelimit-remaining-requests",
            int(limit.saturating_sub(a.used_requests)),
        ));
        h.push((
            "x-ratelimit-reset-requests",
            format_duration_ms(a.reset_requests_ms),
        ));
    }
    if plan.tpm > 0 {
        h.push(("x-ratelimit-limit-tokens", int(plan.tpm)));
        h.push((
            "x-ratelimit-remaining-tokens",
            int(plan.tpm.saturating_sub(a.used_tokens)),
        ));
        h.push((
            "x-ratelimit-reset-tokens",
            format_duration_ms(a.reset_tokens_ms),
        ));
    }
    if a.retry_after_ms > 0 && a.verdict != Verdict::Admitted {
        h.push(("retry-after-ms", int(a.retry_after_ms)));
    }
    h
}

/// A decimal string without the formatting machinery (six per response).
fn int(n: u64) -> String {
    itoa::Buffer::new().format(n).to_owned()
}

/// Go-style durations: `0s`, `12ms`, `1s`, `8.64s`, `6m0s`, `1h2m3s`.
pub fn format_duration_ms(ms: u64) -> String {
    let mut out = String::with_capacity(12);
    let mut num = itoa::Buffer::new();
    if ms < 1000 {
        out.push_str(num.format(ms));
        out.push_str(if ms == 0 { "s" } else { "ms" });
        return out;
    }
    let hours = ms / 3_600_000;
    let minutes = (ms / 60_000) % 60;
    let millis = ms % 60_000;
    if hours > 0 {
        out.push_str(num.format(hours));
        out.push('h');
    }
    if hours > 0 || minutes > 0 {
        out.push_str(num.format(minutes));
        out.push('m');
    }
    out.push_str(num.format(millis / 1000));
    let frac = millis % 1000;
    if frac > 0 {
        // Three digits, trailing zeros dropped: 1.5s, 8.64s, 59.999s.
        let digits = [frac / 100, frac / 10 % 10, frac % 10];
        let keep = 3 - digits.iter().rev().take_while(|d| **d == 0).count();
        out.push('.');
        for d in &digits[..keep] {
            out.push(char::from(b'0' + *d as u8));
        }
    }
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Verdict;

    #[test]
    fn durations_look_like_the_reference_api() {
        for (ms, s) in [
            (0, "0s"),
            (12, "12ms"),
            (999, "999ms"),
            (1000, "1s"),
            (8640, "8.64s"),
            (1500, "1.5s"),
            (59_999, "59.999s"),
            (60_000, "1m0s"),
            (360_000, "6m0s"),
            (61_250, "1m1.25s"),
            (3_723_000, "1h2m3s"),
            (3_600_000, "1h0m0s"),
            (1001, "1.001s"),
            (1010, "1.01s"),
        ] {
            assert_eq!(format_duration_ms(ms), s, "{ms}");
        }
    }

    #[test]
    fn six_headers_for_a_limited_plan_none_for_unlimited() {
        let plan = RatePlan {
            rpm: 60,
            tpm: 1000,
            max_concurrent: 0,
            default_max_tokens: 0,
            ..RatePlan::default()
        };
        let a = Admission {
            verdict: Verdict::Admitted,
            used_requests: 3,
            used_tokens: 250,
            reset_requests_ms: 59_980,
            reset_tokens_ms: 12,
            retry_after_ms: 0,
        };
        let h = rate_limit_headers(&plan, &a);
        let get = |k: &str| h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("x-ratelimit-limit-requests"), Some("60"));
        assert_eq!(get("x-ratelimit-remaining-requests"), Some("57"));
        assert_eq!(get("x-ratelimit-reset-requests"), Some("59.98s"));
        assert_eq!(get("x-ratelimit-limit-tokens"), Some("1000"));
        assert_eq!(get("x-ratelimit-remaining-tokens"), Some("750"));
        assert_eq!(get("x-ratelimit-reset-tokens"), Some("12ms"));
        assert_eq!(h.len(), 6);
        assert!(rate_limit_headers(&RatePlan::default(), &a).is_empty());
    }
}
