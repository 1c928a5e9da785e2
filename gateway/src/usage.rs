//! Usage accounting at the end of a generation: token counters by model
//! and type, and the cost at the model's catalogue price (the spec's
//! table for the three, the config's for an added id).
//!
//! Per organisation, key, model and day, the counters live in Redis (added
//! by the limiter's settle script in the same round trip, see
//! `limits/settle.lua`) and in Prometheus ([`record_account`]);
//! `gateway usage` reads them back ([`read_usage`]).

use crate::auth::Principal;
use crate::catalog::ModelSpec;
use crate::metrics::{model_series, AccountSeries, TokenKind};
use crate::redis::RedisHandle;
use inference_proto::v1 as pb;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// Token usage of one request, as billed. `output` includes `reasoning`;
/// `input` includes `cached_input`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input: u64,
    pub cached_input: u64,
    pub output: u64,
    pub reasoning: u64,
}

impl TokenUsage {
    pub fn from_worker(u: &pb::Usage) -> Self {
        Self {
            input: u.prompt_tokens.into(),
            cached_input: u.cached_prompt_tokens.into(),
            output: u.completion_tokens.into(),
            reasoning: u.reasoning_tokens.into(),
        }
    }

    pub fn total(&self) -> u64 {
        self.input + self.output
    }

    /// The tokens by the kind the counters split them into: fresh and
    /// cached input, visible output and reasoning (each counted once).
    pub fn by_kind(&self) -> [(TokenKind, u64); 4] {
        [
            (
                TokenKind::Input,
                self.input.saturating_sub(self.cached_input),
            ),
            (TokenKind::CachedInput, self.cached_input),
            (
                TokenKind::Output,
                self.output.saturating_sub(self.reasoning),
            ),
            (TokenKind::Reasoning, self.reasoning),
        ]
    }
}

/// Cost in nano-dollars (exact: every price is a whole number of
/// nano-dollars per token). Cached input at the cached rate, the rest of
/// the input at the input rate, output (reasoning included) at the output rate.
pub fn cost_nano(model: &ModelSpec, u: &TokenUsage) -> i64 {
    let nano = |usd_per_million: f64| (usd_per_million * 1000.0).round() as i64;
    let fresh = u.input.saturating_sub(u.cached_input) as i64;
    fresh * nano(model.price.input)
        + u.cached_input as i64 * nano(model.price.cached_input)
        + u.output as i64 * nano(model.price.output)
}

/// Records a finished generation's tokens.
pub fn record(model: &ModelSpec, usage: &TokenUsage) {
    let Some(series) = model_series(model.id) else {
        return;
    };
    for (kind, n) in usage.by_kind() {
        if n > 0 {
            series.tokens(kind).inc_by(n);
        }
    }
}

/// Prometheus counters of one settled request, by organisation, key and
/// model (the series are kept with the account, see [`AccountSeries`]).
pub fn record_account(
    model: &ModelSpec,
    who: &Principal,
    series: &AccountSeries,
    u: &TokenUsage,
    cost_nano: i64,
) {
    let Some(series) = series.for_model(&who.org, &who.key_id, model.id) else {
        return;
    };
    for (kind, n) in u.by_kind() {
        if n > 0 {
            series.tokens[kind as usize].inc_by(n);
        }
    }
    if cost_nano > 0 {
        series.cost.inc_by(cost_nano as f64 / 1e9);
    }
}

/// The UTC calendar day of `t`, `YYYY-MM-DD` (the usage counters' key).
pub fn utc_day(t: SystemTime) -> String {
    let days = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Today's UTC day, `YYYY-MM-DD`, formatted once a day per thread (every
/// settlement names it).
pub fn utc_today() -> std::sync::Arc<str> {
    thread_local! {
        static TODAY: std::cell::RefCell<(u64, std::sync::Arc<str>)> =
            std::cell::RefCell::new((u64::MAX, "".into()));
    }
    let now = SystemTime::now();
    let days = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0);
    TODAY.with(|today| {
        let mut today = today.borrow_mut();
        if today.0 != days {
            *today = (days, utc_day(now).into());
        }
        today.1.clone()
    })
}

/// Days since 1970-01-01 to (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day) to days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `YYYY-MM-DD` into days since the epoch.
pub fn parse_day(s: &str) -> Option<i64> {
    let mut it = s.trim().splitn(3, '-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: u32 = it.next()?.parse().ok()?;
    let d: u32 = it.next()?.parse().ok()?;
    ((1..=12).contains(&m) && (1..=31).contains(&d)).then(|| days_from_civil(y, m, d))
}

/// One row of `gateway usage`: a day, key and model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageRow {
    pub requests: i64,
    pub input: i64,
    pub cached_input: i64,
    pub output: i64,
    pub reasoning: i64,
    pub cost_nano: i64,
}

/// `<prefix>usage:{<org>}:<day>`: an organisation's usage of one UTC day
/// (`YYYY-MM-DD`), which the limiter's `settle.lua` writes and
/// [`read_usage`] reads.
pub fn usage_key(redis: &RedisHandle, org: &str, day: &str) -> String {
    redis.key("usage", org, ":") + day
}

/// Usage of `org` from day `since` (days since the epoch) to today, by
/// (day, key id, model).
pub async fn read_usage(
    redis: &RedisHandle,
    org: &str,
    since: i64,
    today: i64,
) -> anyhow::Result<BTreeMap<(String, String, String), UsageRow>> {
    let mut conn = redis.conn().await?;
    let mut out = BTreeMap::new();
    for day in since..=today {
        let (y, m, d) = civil_from_days(day);
        let day = format!("{y:04}-{m:02}-{d:02}");
        let key = usage_key(redis, org, &day);
        let h: BTreeMap<String, i64> = redis::AsyncCommands::hgetall(&mut conn, key).await?;
        for (field, n) in h {
            let mut parts = field.rsplitn(3, '|');
            let (Some(counter), Some(model), Some(key_id)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let row: &mut UsageRow = out
                .entry((day.clone(), key_id.to_owned(), model.to_owned()))
                .or_default();
            match counter {
                "requests" => row.requests += n,
                "input" => row.input += n,
                "cached_input" => row.cached_input += n,
                "output" => row.output += n,
                "reasoning" => row.reasoning += n,
                "cost_nano" => row.cost_nano += n,
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Today as days since the epoch (UTC).
pub fn today() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| (d.as_secs() / 86_400) as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_round_trip() {
        assert_eq!(utc_day(UNIX_EPOCH), "1970-01-01");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_795_392_000); // 2026-11-23
        assert_eq!(utc_day(t), "2026-11-23");
        assert_eq!(parse_day("2026-11-23"), Some(1_795_392_000 / 86_400));
        assert_eq!(
            parse_day("2024-02-29").map(civil_from_days),
            Some((2024, 2, 29))
        );
        assert_eq!(parse_day("2026-13-01"), None);
        assert_eq!(parse_day("yesterday"), None);
    }

    #[test]
    fn cost_in_nano_dollars_matches_the_price_table() {
        let base = crate::catalog::Catalog::default().find("base").unwrap();
        let u = TokenUsage {
            input: 1_000_000,
            cached_input: 400_000,
            output: 200_000,
            reasoning: 50_000,
        };
        // 600k * 0.50 + 400k * 0.05 + 200k (reasoning included) * 1.90 = 0.70 USD
        assert_eq!(cost_nano(base, &u), 700_000_000);
        let mini = crate::catalog::Catalog::default()
            .find("base-mini")
            .unwrap();
        let one_each = TokenUsage {
            input: 2,
            cached_input: 1,
            output: 1,
            reasoning: 0,
        };
        assert_eq!(cost_nano(mini, &one_each), 180 + 18 + 450);
    }

    #[test]
    fn tokens_split_into_kinds_each_counted_once() {
        let u = TokenUsage::from_worker(&pb::Usage {
            prompt_tokens: 1_000,
            cached_prompt_tokens: 400,
            completion_tokens: 200,
            reasoning_tokens: 50,
            image_tokens: 0,
        });
        assert_eq!(
            u.by_kind().map(|(_, n)| n),
            [600, 400, 150, 50],
            "fresh input, cached input, visible output, reasoning"
        );
    }
}
