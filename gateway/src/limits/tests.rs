//! The limiter's own tests: admission at both stages, the slot heartbeat,
//! settling a dropped reservation, and what a refusal says.

use super::limiter::Limiter;
use super::refusal::{RateLimited, Refusal, Refused};
use super::reservation::{Outcome, Reservation};
use super::slots::{self, SlotLease};
use super::store::{AdmitRequest, Verdict};
use super::RatePlan;
use crate::accounts::Account;
use crate::config::OnStoreFailure;
use crate::error::ApiError;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn account(plan: RatePlan) -> Arc<Account> {
    Arc::new(Account {
        principal: crate::auth::Principal {
            org: "org-drop".into(),
            key_name: "k".into(),
            key_id: "0123456789ab".into(),
        },
        scopes: crate::accounts::Scopes::ALL,
        models: None,
        plan_name: "p".into(),
        plan,
        org: Default::default(),
        series: Default::default(),
    })
}

fn test_slots() -> SlotLease {
    SlotLease::new(
        Duration::from_secs(60),
        Duration::from_secs(1),
        Duration::from_secs(600),
    )
}

/// The `x-ratelimit-*` headers an admission's answer asks for.
fn rate_headers(admitted: &Result<Reservation, Refused>) -> Vec<(&'static str, String)> {
    match admitted {
        Ok(r) => r.rate_headers(),
        Err(r) => r.rate_headers(),
    }
}

fn retry_after_ms(headers: &[(&str, String)]) -> Option<u64> {
    headers
        .iter()
        .find(|(k, _)| *k == "retry-after-ms")
        .and_then(|(_, v)| v.parse().ok())
}

/// A heartbeat keeps a live reservation's slot for many leases; a
/// reservation past its renewal deadline (a guard leaked by a live
/// replica, or a dead replica's, which renews nothing) loses it within
/// one lease, and the refusal before says when.
#[tokio::test]
async fn the_heartbeat_keeps_a_live_slot_and_an_unrenewed_one_lapses_within_a_lease() {
    let lease = Duration::from_millis(400);
    let limiter = Arc::new(Limiter::new(
        None,
        OnStoreFailure::FailOpenLocal,
        SlotLease::new(lease, Duration::from_millis(50), Duration::from_secs(600)),
    ));
    let heartbeat = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.maintain().await }
    });
    let plan = RatePlan {
        max_concurrent: 1,
        ..RatePlan::default()
    };
    let acc = account(plan);
    let base = crate::catalog::Catalog::default().find("base").unwrap();
    let r = limiter.admit_request(&acc, base, "r1".into(), 1, 1).await;
    let held = r.unwrap();
    tokio::time::sleep(lease * 3).await;
    // Another replica's view: this process's local count aside, the
    // store still holds the slot, and its live owner gets a short hint.
    let r2 = AdmitRequest {
        org: &acc.principal.org,
        model: base.id,
        request_id: "r2",
        tokens: 1,
        plan,
        budget_nano: None,
        slot_lease_ms: limiter.slots.lease_ms(),
        renew_every_ms: limiter.slots.renew_every_ms(),
        taken_over: false,
    };
    let a = limiter.memory.admit_now(&r2);
    assert_eq!(a.verdict, Verdict::Concurrency);
    assert!(
        (1..=slots::LIVE_RETRY_MS).contains(&a.retry_after_ms),
        "{a:?}"
    );
    assert_eq!(limiter.live.len(), 1);

    // The owner stops renewing (as a dead replica does).
    heartbeat.abort();
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let a = limiter.memory.admit_now(&r2);
    assert_eq!(a.verdict, Verdict::Concurrency);
    // Two renewals missed: the refusal says when the slot lapses.
    assert!(a.retry_after_ms <= 200, "{a:?}");
    tokio::time::sleep(Duration::from_millis(a.retry_after_ms)).await;
    let a = limiter.memory.admit_now(&r2);
    assert_eq!(a.verdict, Verdict::Admitted, "lapsed when it said");
    assert!(stopped.elapsed() < lease + Duration::from_millis(150));
    held.settle(Outcome::NotRun).await;
    assert_eq!(limiter.live.len(), 0, "a settled slot is not renewed");
}

#[tokio::test]
async fn a_reservation_past_its_deadline_is_no_longer_renewed() {
    let lease = Duration::from_millis(300);
    let limiter = Arc::new(Limiter::new(
        None,
        OnStoreFailure::FailOpenLocal,
        SlotLease::new(lease, Duration::from_millis(50), lease),
    ));
    let heartbeat = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.maintain().await }
    });
    let plan = RatePlan {
        max_concurrent: 1,
        ..RatePlan::default()
    };
    let (acc, base) = (
        account(plan),
        crate::catalog::Catalog::default().find("base").unwrap(),
    );
    let r = limiter.admit_request(&acc, base, "r1".into(), 1, 1).await;
    let _leaked = r.unwrap();
    let r = limiter.admit_request(&acc, base, "r2".into(), 1, 1).await;
    let headers = rate_headers(&r);
    assert!(r.is_err());
    assert!(retry_after_ms(&headers).is_some());
    // Renewed until its deadline (one lease here), then lapsed within
    // one more lease, while the heartbeat goes on.
    tokio::time::sleep(lease * 2 + Duration::from_millis(50)).await;
    let r2 = AdmitRequest {
        org: &acc.principal.org,
        model: base.id,
        request_id: "r2",
        tokens: 1,
        plan,
        budget_nano: None,
        slot_lease_ms: limiter.slots.lease_ms(),
        renew_every_ms: limiter.slots.renew_every_ms(),
        taken_over: false,
    };
    assert_eq!(limiter.memory.admit_now(&r2).verdict, Verdict::Admitted);
    heartbeat.abort();
}

#[tokio::test]
async fn a_dropped_reservation_releases_its_slot_and_tokens() {
    let limiter = Arc::new(Limiter::new(
        None,
        OnStoreFailure::FailOpenLocal,
        test_slots(),
    ));
    let plan = RatePlan {
        rpm: 0,
        tpm: 1000,
        max_concurrent: 1,
        default_max_tokens: 0,
        ..RatePlan::default()
    };
    let acc = account(plan);
    let base = crate::catalog::Catalog::default().find("base").unwrap();
    let r = limiter
        .admit_request(&acc, base, "r1".into(), 100, 800)
        .await;
    let headers = rate_headers(&r);
    let mut reservation = r.unwrap();
    assert!(headers
        .iter()
        .any(|(k, v)| *k == "x-ratelimit-remaining-tokens" && v == "100"));
    // Busy: one in flight, 900 of 1000 tokens reserved.
    let r = limiter.admit_request(&acc, base, "r2".into(), 10, 1).await;
    let headers = rate_headers(&r);
    assert_eq!(r.err().map(|e| ApiError::from(e).status), Some(429));
    assert!(headers.iter().any(|(k, _)| *k == "retry-after-ms"));
    // The request is abandoned mid-stream: dropped, never settled.
    reservation.mark_started();
    reservation.observe_output(5);
    drop(reservation);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let r = limiter
        .admit_request(&acc, base, "r3".into(), 10, 800)
        .await;
    let headers = rate_headers(&r);
    assert!(r.is_ok(), "slot and unused tokens are back");
    // 100 input estimate + 5 output billed for r1, 810 reserved by r3.
    assert!(
        headers
            .iter()
            .any(|(k, v)| *k == "x-ratelimit-remaining-tokens" && v == "85"),
        "{headers:?}"
    );
}

/// Every 429 for one full window carries the same reset, whichever
/// stage answers it: the global stage's first, then the local stage's.
#[tokio::test]
async fn refusals_of_one_full_window_carry_the_same_reset_at_both_stages() {
    let limiter = Arc::new(Limiter::new(
        None,
        OnStoreFailure::FailOpenLocal,
        test_slots(),
    ));
    let plan = RatePlan {
        rpm: 3,
        ..RatePlan::default()
    };
    let acc = account(plan);
    let base = crate::catalog::Catalog::default().find("base").unwrap();
    for i in 0..3 {
        let r = limiter
            .admit_request(&acc, base, format!("r{i}"), 1, 1)
            .await;
        r.unwrap().settle(Outcome::NotRun).await;
    }
    let header =
        |h: &[(&str, String)], k: &str| h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let mut waits = Vec::new();
    for i in 3..6 {
        let r = limiter
            .admit_request(&acc, base, format!("r{i}"), 1, 1)
            .await;
        let headers = rate_headers(&r);
        let e = ApiError::from(r.err().expect("refused"));
        assert_eq!(
            (e.status, e.retry_after_secs),
            (429, Some(60)),
            "{headers:?}"
        );
        let ms: u64 = header(&headers, "retry-after-ms").unwrap().parse().unwrap();
        assert!((58_000..=60_000).contains(&ms), "{headers:?}");
        assert!(header(&headers, "x-ratelimit-reset-requests").is_some());
        assert_eq!(
            header(&headers, "x-ratelimit-remaining-requests").as_deref(),
            Some("0")
        );
        waits.push(ms);
    }
    // One reset, counted down (the first refusal is the global stage's,
    // the others the local stage's).
    assert!(
        waits
            .windows(2)
            .all(|w| w[0] >= w[1] && w[0] - w[1] < 1_000),
        "{waits:?}"
    );
}

#[test]
fn each_verdict_is_counted_under_its_own_decision_label() {
    for (verdict, label) in [
        (Verdict::Admitted, "admitted"),
        (Verdict::Requests, "requests"),
        (Verdict::Tokens, "tokens"),
        (Verdict::Concurrency, "concurrency"),
        (Verdict::OverBudget, "budget"),
    ] {
        assert_eq!(verdict.decision().label(), label);
    }
}

/// The client's view of a rate-limit refusal.
fn refusal_error(verdict: Verdict, tokens: u64, plan: &RatePlan, retry_ms: u64) -> ApiError {
    ApiError::from(Refusal::RateLimited(RateLimited::new(
        verdict, tokens, plan, retry_ms,
    )))
}

#[test]
fn refusal_messages_and_retry_after() {
    let plan = RatePlan {
        rpm: 10,
        tpm: 100,
        max_concurrent: 2,
        default_max_tokens: 0,
        ..RatePlan::default()
    };
    let e = refusal_error(Verdict::Requests, 5, &plan, 1500);
    assert_eq!(
        (e.status, e.code.as_ref(), e.error_type()),
        (429, "rate_limit_exceeded", "rate_limit_error")
    );
    assert_eq!(e.retry_after_secs, Some(2));
    assert_eq!(
        refusal_error(Verdict::Concurrency, 5, &plan, 0).retry_after_secs,
        Some(1)
    );
    assert!(refusal_error(Verdict::Tokens, 500, &plan, 60_000)
        .message
        .contains("too large"));
}

/// A background run handed over by a draining replica continues the
/// request that was admitted: its plan's limits never refuse it, and when
/// the first owner had started it (and billed the request and its input)
/// it bills only the rest.
#[tokio::test]
async fn a_taken_over_request_is_never_refused_and_is_billed_as_the_rest_of_one() {
    let limiter = Arc::new(Limiter::new(
        None,
        OnStoreFailure::FailOpenLocal,
        test_slots(),
    ));
    let plan = RatePlan {
        rpm: 1,
        max_concurrent: 1,
        ..RatePlan::default()
    };
    let acc = account(plan);
    let base = crate::catalog::Catalog::default().find("base").unwrap();
    let r = limiter.admit_request(&acc, base, "r1".into(), 50, 10).await;
    let first = r.expect("admitted");
    let refused = limiter.admit_request(&acc, base, "r2".into(), 50, 10).await;
    assert!(refused.is_err(), "the org is at its limits");
    let continued = limiter
        .take_over(&acc, base, "r1-adopted".into(), 50, 10, true)
        .await
        .expect("taken over at the limits");
    assert_eq!(continued.input_estimate(), 0, "its input was billed");
    assert!(!continued.counts_request);
    let from_start = limiter
        .take_over(&acc, base, "r3-adopted".into(), 50, 10, false)
        .await
        .expect("taken over at the limits");
    assert_eq!(from_start.input_estimate(), 50);
    assert!(from_start.counts_request);
    assert_eq!(limiter.live.len(), 3, "each holds its slot while it runs");
    for r in [first, continued, from_start] {
        r.settle(Outcome::NotRun).await;
    }
    assert_eq!(limiter.live.len(), 0);
}
