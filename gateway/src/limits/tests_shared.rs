//! One behavioural suite that every [`LimitStore`] must pass.

use super::slots;
use super::store::{AdmitRequest, LimitStore, Settlement, Verdict};
use super::{RatePlan, TokenUsage};
use std::time::{Duration, Instant};

fn req<'a>(
    model: &'a str,
    rid: &'a str,
    tokens: u64,
    plan: RatePlan,
    budget: Option<i64>,
) -> AdmitRequest<'a> {
    AdmitRequest {
        org: "org-suite",
        model,
        request_id: rid,
        tokens,
        plan,
        budget_nano: budget,
        slot_lease_ms: 60_000,
        renew_every_ms: 1_000,
        taken_over: false,
    }
}

pub(crate) fn settlement<'a>(
    model: &'a str,
    rid: &'a str,
    reserved: u64,
    usage: Option<TokenUsage>,
    cost: i64,
) -> Settlement<'a> {
    Settlement {
        org: "org-suite",
        model,
        key_id: "k1",
        request_id: rid,
        reserved_tokens: reserved,
        actual_tokens: usage.map(|u| u.total()).unwrap_or(0),
        usage,
        counts_request: true,
        cost_nano: cost,
        day: "2026-11-23",
    }
}

async fn settle_now(store: &dyn LimitStore, s: Settlement<'_>) {
    store.settle(&s).await.unwrap();
    store.flush().await;
}

/// Leased concurrency slots: renewal keeps a slot past its lease; an
/// unrenewed slot lapses within one lease, and the refusals before say
/// when; a lapsed or settled slot is not brought back by a renewal.
pub(crate) async fn lease_suite(store: &dyn LimitStore) {
    const LEASE_MS: u64 = 1000;
    const RENEW_MS: u64 = 100;
    let plan = RatePlan {
        max_concurrent: 2,
        ..RatePlan::default()
    };
    let admit = |rid: &'static str| {
        let r = AdmitRequest {
            org: "org-lease",
            model: "base",
            request_id: rid,
            tokens: 1,
            plan,
            budget_nano: None,
            slot_lease_ms: LEASE_MS,
            renew_every_ms: RENEW_MS,
            taken_over: false,
        };
        async move { store.admit(&r).await.unwrap() }
    };
    let renew = |rids: &[&str]| {
        let ids: Vec<String> = rids.iter().map(|s| s.to_string()).collect();
        async move {
            store
                .renew("org-lease", "base", &ids, LEASE_MS)
                .await
                .unwrap()
        }
    };
    let release = |rid: &'static str| async move {
        let mut s = settlement("base", rid, 0, None, 0);
        s.org = "org-lease";
        settle_now(store, s).await;
    };
    let beat = Duration::from_millis(RENEW_MS);

    assert_eq!(admit("a").await.verdict, Verdict::Admitted);
    assert_eq!(admit("b").await.verdict, Verdict::Admitted);
    let refused = admit("c").await;
    assert_eq!(refused.verdict, Verdict::Concurrency);
    // Both owners just wrote their slots: a short hint.
    assert!(
        (1..=slots::LIVE_RETRY_MS).contains(&refused.retry_after_ms),
        "{refused:?}"
    );

    // Renewed for two leases: still held, still live.
    let until = Instant::now() + Duration::from_millis(2 * LEASE_MS);
    while Instant::now() < until {
        renew(&["a", "b"]).await;
        tokio::time::sleep(beat).await;
    }
    let refused = admit("c").await;
    assert_eq!(refused.verdict, Verdict::Concurrency, "renewal keeps slots");
    assert!(
        refused.retry_after_ms <= slots::LIVE_RETRY_MS,
        "{refused:?}"
    );

    // `a`'s owner stops renewing (dies); `b`'s goes on.
    renew(&["a", "b"]).await;
    let stopped = Instant::now();
    for _ in 0..5 {
        tokio::time::sleep(beat).await;
        renew(&["b"]).await;
    }
    let waited = stopped.elapsed().as_millis() as u64;
    let refused = admit("c").await;
    assert_eq!(refused.verdict, Verdict::Concurrency);
    // Two renewals missed: the refusal says when `a` lapses (at most
    // one lease after its last renewal; +2: clocks in whole ms).
    let said = refused.retry_after_ms;
    let at_most = LEASE_MS - waited + 2;
    assert!(said > 0 && said <= at_most, "{refused:?}, {at_most}");
    tokio::time::sleep(Duration::from_millis(said)).await;
    assert_eq!(admit("c").await.verdict, Verdict::Admitted, "when it said");
    assert!(stopped.elapsed() < Duration::from_millis(LEASE_MS + 300));

    // A renewal of the lapsed `a` does not bring it back: with `b`
    // settled, only `c` holds a slot.
    renew(&["a", "b", "c"]).await;
    release("b").await;
    assert_eq!(admit("d").await.verdict, Verdict::Admitted);
    // A settled slot neither: with `c` settled, only `d` holds one.
    release("c").await;
    renew(&["b", "c", "d"]).await;
    assert_eq!(admit("e").await.verdict, Verdict::Admitted);
    assert_eq!(admit("f").await.verdict, Verdict::Concurrency);
    release("d").await;
    release("e").await;
}

pub(crate) async fn suite(store: &dyn LimitStore) {
    // Requests and concurrency on `base`.
    let plan = RatePlan {
        rpm: 3,
        tpm: 1000,
        max_concurrent: 2,
        default_max_tokens: 0,
        ..RatePlan::default()
    };
    let a = store
        .admit(&req("base", "r1", 300, plan, None))
        .await
        .unwrap();
    assert_eq!(a.verdict, Verdict::Admitted);
    assert_eq!((a.used_requests, a.used_tokens), (1, 300));
    assert!((59_000..=60_000).contains(&a.reset_requests_ms), "{a:?}");
    assert!((59_000..=60_000).contains(&a.reset_tokens_ms), "{a:?}");
    let a = store
        .admit(&req("base", "r2", 300, plan, None))
        .await
        .unwrap();
    assert_eq!(
        (a.verdict, a.used_requests, a.used_tokens),
        (Verdict::Admitted, 2, 600)
    );
    // Third concurrent request: refused, and a refusal records nothing.
    let a = store
        .admit(&req("base", "r3", 100, plan, None))
        .await
        .unwrap();
    assert_eq!(
        (a.verdict, a.used_requests, a.used_tokens),
        (Verdict::Concurrency, 2, 600)
    );
    assert!(a.retry_after_ms > 0);

    // r1 ends having used 100 tokens: slot and 200 tokens come back.
    let used = TokenUsage {
        input: 100,
        cached_input: 10,
        output: 0,
        reasoning: 5,
    };
    settle_now(store, settlement("base", "r1", 300, Some(used), 777)).await;
    let a = store
        .admit(&req("base", "r3", 600, plan, None))
        .await
        .unwrap();
    assert_eq!(
        (a.verdict, a.used_requests, a.used_tokens),
        (Verdict::Admitted, 3, 1000)
    );

    // Both in flight end without running; the request window is full.
    settle_now(store, settlement("base", "r2", 300, None, 0)).await;
    settle_now(store, settlement("base", "r3", 600, None, 0)).await;
    let a = store
        .admit(&req("base", "r4", 1, plan, None))
        .await
        .unwrap();
    assert_eq!(a.verdict, Verdict::Requests);
    assert_eq!(a.used_tokens, 100);
    assert!((59_000..=60_000).contains(&a.retry_after_ms), "{a:?}");

    // Tokens on `base-mini`, a model of its own.
    let plan = RatePlan {
        rpm: 0,
        tpm: 1000,
        max_concurrent: 0,
        default_max_tokens: 0,
        ..RatePlan::default()
    };
    let a = store
        .admit(&req("base-mini", "t1", 800, plan, None))
        .await
        .unwrap();
    assert_eq!(
        (a.verdict, a.used_requests, a.used_tokens),
        (Verdict::Admitted, 0, 800)
    );
    let a = store
        .admit(&req("base-mini", "t2", 300, plan, None))
        .await
        .unwrap();
    assert_eq!(a.verdict, Verdict::Tokens);
    assert!((59_000..=60_000).contains(&a.retry_after_ms), "{a:?}");
    let a = store
        .admit(&req("base-mini", "t3", 1001, plan, None))
        .await
        .unwrap();
    assert_eq!(a.verdict, Verdict::Tokens);
    // t1 used only 500: 300 more fit.
    let half = TokenUsage {
        input: 250,
        cached_input: 0,
        output: 250,
        reasoning: 0,
    };
    settle_now(store, settlement("base-mini", "t1", 800, Some(half), 0)).await;
    let a = store
        .admit(&req("base-mini", "t2", 300, plan, None))
        .await
        .unwrap();
    assert_eq!((a.verdict, a.used_tokens), (Verdict::Admitted, 800));
    // A request that used more than it reserved counts in full.
    let over = TokenUsage {
        input: 100,
        cached_input: 0,
        output: 400,
        reasoning: 0,
    };
    settle_now(store, settlement("base-mini", "t2", 300, Some(over), 0)).await;
    let a = store
        .admit(&req("base-mini", "t4", 1, plan, None))
        .await
        .unwrap();
    assert_eq!((a.verdict, a.used_tokens), (Verdict::Tokens, 1000));
    let a = store
        .admit(&req("base-mini", "t4", 0, plan, None))
        .await
        .unwrap();
    assert_eq!((a.verdict, a.used_tokens), (Verdict::Admitted, 1000));

    // Budget: r1 cost 777 nano-dollars.
    let open = RatePlan::default();
    let a = store
        .admit(&req("base-ultra", "b1", 1, open, Some(777)))
        .await
        .unwrap();
    assert_eq!(a.verdict, Verdict::OverBudget);
    let a = store
        .admit(&req("base-ultra", "b2", 1, open, Some(778)))
        .await
        .unwrap();
    assert_eq!(a.verdict, Verdict::Admitted);
    taken_over(store).await;
}

/// A request taken over from another replica (a handed-over background
/// run): never refused (requests, tokens, concurrency, budget), holding its
/// tokens and slot, and not counted again as a request.
async fn taken_over(store: &dyn LimitStore) {
    let plan = RatePlan {
        rpm: 1,
        tpm: 100,
        max_concurrent: 1,
        default_max_tokens: 0,
        ..RatePlan::default()
    };
    let a = store
        .admit(&req("handed", "h1", 60, plan, None))
        .await
        .unwrap();
    assert_eq!(a.verdict, Verdict::Admitted);
    let over = AdmitRequest {
        taken_over: true,
        ..req("handed", "h1-adopted", 60, plan, Some(0))
    };
    let a = store.admit(&over).await.unwrap();
    assert_eq!(
        (a.verdict, a.used_requests, a.used_tokens),
        (Verdict::Admitted, 1, 120)
    );
    // It holds a slot: the next request waits for it.
    let a = store
        .admit(&req("handed", "h2", 1, plan, None))
        .await
        .unwrap();
    assert_eq!(a.verdict, Verdict::Concurrency);
    settle_now(store, settlement("handed", "h1", 60, None, 0)).await;
    settle_now(store, settlement("handed", "h1-adopted", 60, None, 0)).await;
    // The window holds one request, the one admitted.
    let a = store
        .admit(&req("handed", "h2", 1, plan, None))
        .await
        .unwrap();
    assert_eq!((a.verdict, a.used_requests), (Verdict::Requests, 1));
}
