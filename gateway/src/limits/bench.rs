//! The hot-path benchmark: gateway CPU of authentication (warm key cache)
//! plus admission and settlement against the real Redis, and the Redis
//! commands each request costs. Run:
//! `cargo test --release -p gateway --lib bench_ -- --ignored --nocapture`

use super::{Limiter, Outcome, RatePlan};
use crate::accounts::cache::Accounts;
use crate::accounts::store::AccountStore;
use crate::accounts::Scopes;
use crate::config::Config;
use crate::redis::testing::{cleanup, test_redis};
use crate::redis::RedisHandle;
use harness::procfs::{thread_cpu, thread_user_cpu};
use inference_proto::v1 as pb;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn evalsha_calls(redis: &RedisHandle) -> u64 {
    let mut conn = redis.conn().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[test]
#[ignore = "benchmark; run with --ignored --nocapture"]
fn bench_hot_path_auth_and_limits() {
    // One thread runs everything the gateway does (including the Redis
    // connection's driver task), so its CPU clock is the gateway's cost.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let redis = test_redis();
        let mut config = Config::defaults();
        config.limits.key_cache_ttl_ms = 600_000;
        let store = AccountStore::new(redis.clone());
        let plan = RatePlan {
            rpm: 10_000_000,
            tpm: 10_000_000_000,
            max_concurrent: 100_000,
            default_max_tokens: 0,
            ..RatePlan::default()
        };
        store.set_plan("bench", &plan).await.unwrap();
        let (secret, _) = store
            .create_key("org-bench", "bench", "bench", Scopes::ALL, None)
            .await
            .unwrap();
        let header = format!("Bearer {secret}");
        let accounts = Accounts::from_config(&config, Some(redis.clone())).unwrap();
        let limiter = Arc::new(Limiter::from_config(&config, Some(redis.clone())));
        let model = crate::catalog::Catalog::default().find("base").unwrap();
        let usage = pb::Usage {
            prompt_tokens: 20,
            cached_prompt_tokens: 0,
            completion_tokens: 30,
            reasoning_tokens: 0,
            image_tokens: 0,
        };
        let one = |i: usize| {
            let accounts = &accounts;
            let limiter = &limiter;
            let header = &header;
            let usage = &usage;
            async move {
                let account = accounts.authenticate(Some(header.as_bytes())).await.unwrap();
                account.check_org().unwrap();
                account.check_model(model.id).unwrap();
                let r = limiter
                    .admit_request(&account, model, format!("req_bench{i}"), 25, 64)
                    .await
                    .unwrap();
                assert_eq!(r.rate_headers().len(), 6);
                r.settle(Outcome::Finished(usage)).await;
            }
        };
        for i in 0..500 {
            one(i).await;
        }
        let n = 5000;
        let calls_before = evalsha_calls(&redis).await;
        let (cpu0, user0, wall0) = (thread_cpu(), thread_user_cpu(), Instant::now());
        for i in 0..n {
            one(1000 + i).await;
        }
        limiter.flush().await;
        let (cpu, user, wall) = (
            thread_cpu() - cpu0,
            thread_user_cpu() - user0,
            wall0.elapsed(),
        );
        let calls = evalsha_calls(&redis).await - calls_before;

        // The same with 64 requests in flight (a loaded gateway: the
        // multiplexed connection then writes many commands per syscall).
        // Longer: this is the figure the target is about, and the
        // user/system split is only sampled at clock ticks.
        let loaded_n = 10 * n;
        let (cpu2, user2) = (thread_cpu(), thread_user_cpu());
        let mut in_flight = futures::stream::FuturesUnordered::new();
        for i in 0..loaded_n {
            in_flight.push(one(100_000 + i));
            if in_flight.len() >= 64 {
                futures::StreamExt::next(&mut in_flight).await;
            }
        }
        while futures::StreamExt::next(&mut in_flight).await.is_some() {}
        limiter.flush().await;
        let (loaded_cpu, loaded_user) = (thread_cpu() - cpu2, thread_user_cpu() - user2);

        // A bare PING round trip through the same connection: the floor.
        let mut conn = redis.conn().await.unwrap();
        let cpu3 = thread_cpu();
        for _ in 0..n {
            let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        }
        let ping_cpu = thread_cpu() - cpu3;

        // Authentication alone (warm cache).
        let cpu1 = thread_cpu();
        for _ in 0..n {
            let a = accounts.authenticate(Some(header.as_bytes())).await.unwrap();
            std::hint::black_box(a);
        }
        let auth_cpu = thread_cpu() - cpu1;
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
        let loaded_us = |d: Duration| d.as_secs_f64() * 1e6 / loaded_n as f64;
        println!(
            "hot path, per request over {n}: auth+admit+settle {:.2} µs gateway CPU one at a time \
             ({:.2} µs user mode, the rest is the kernel's socket work), {:.2} µs with 64 in flight \
             ({:.2} µs user mode); auth alone {:.2} µs; one bare Redis PING round trip {:.2} µs; \
             {:.1} µs wall; {:.2} Redis scripts (round trips) per request",
            us(cpu),
            us(user),
            loaded_us(loaded_cpu),
            loaded_us(loaded_user),
            us(auth_cpu),
            us(ping_cpu),
            us(wall),
            calls as f64 / n as f64,
        );
        cleanup(&redis).await;
    });
}
