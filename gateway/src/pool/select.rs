//! Worker selection policies.
//!
//! - `LeastLoaded`: power of two choices over the load score. Cheap, and
//!   avoids the herd behaviour of always picking the global minimum.
//! - `PrefixAffinity`: rendezvous hashing on an affinity key (cache key,
//!   session, or a hash of the prompt's head) with bounded load: a key sticks
//!   to its worker so the worker's prefix cache hits, unless that worker
//!   carries more than `LOAD_FACTOR` × the average; then the next worker in
//!   the key's order takes it.

use super::endpoint::WorkerEndpoint;
use crate::config::PoolPolicy;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A worker may carry this factor over the pool's average before a sticky
/// key spills to its next-preferred worker.
const LOAD_FACTOR: f64 = 1.25;

/// Picks among `candidates` (indices into `endpoints`).
pub fn pick(
    policy: PoolPolicy,
    endpoints: &[Arc<WorkerEndpoint>],
    candidates: &[usize],
    affinity_key: u64,
) -> Option<usize> {
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0]),
        _ => match policy {
            PoolPolicy::LeastLoaded => Some(two_choices(endpoints, candidates)),
            PoolPolicy::PrefixAffinity => bounded_rendezvous(endpoints, candidates, affinity_key)
                .or_else(|| Some(two_choices(endpoints, candidates))),
        },
    }
}

fn two_choices(endpoints: &[Arc<WorkerEndpoint>], candidates: &[usize]) -> usize {
    use rand::Rng;
    let n = candidates.len();
    let mut rng = rand::rng();
    let a = rng.random_range(0..n);
    let mut b = rng.random_range(0..n - 1);
    if b >= a {
        b += 1;
    }
    let (a, b) = (candidates[a], candidates[b]);
    if endpoints[a].load_score() <= endpoints[b].load_score() {
        a
    } else {
        b
    }
}

fn bounded_rendezvous(
    endpoints: &[Arc<WorkerEndpoint>],
    candidates: &[usize],
    key: u64,
) -> Option<usize> {
    let total: u32 = candidates.iter().map(|&i| endpoints[i].load_score()).sum();
    let bound = (LOAD_FACTOR * f64::from(total + 1) / candidates.len() as f64).ceil() as u32;
    let mut ranked: Vec<(u64, usize)> = candidates
        .iter()
        .map(|&i| (rendezvous_weight(key, endpoints[i].addr()), i))
        .collect();
    ranked.sort_unstable_by_key(|&(weight, _)| std::cmp::Reverse(weight));
    ranked
        .into_iter()
        .find(|&(_, i)| endpoints[i].load_score() < bound.max(1))
        .map(|(_, i)| i)
}

fn rendezvous_weight(key: u64, addr: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    addr.hash(&mut h);
    h.finish()
}

/// The affinity key of a request: its explicit cache key (or session) when
/// given, else a hash of the conversation's first bytes, where shared system
/// prompts and few-shot prefixes live.
pub fn affinity_key(request: &inference_proto::v1::GenerateRequest) -> u64 {
    const PREFIX_BYTES: usize = 1024;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if !request.cache_key.is_empty() {
        request.cache_key.hash(&mut h);
        return h.finish();
    }
    let mut budget = PREFIX_BYTES;
    'outer: for m in &request.messages {
        m.role.hash(&mut h);
        for part in &m.content {
            if let Some(inference_proto::v1::content_part::Part::Text(t)) = &part.part {
                let mut end = t.len().min(budget);
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                t[..end].hash(&mut h);
                budget -= end;
                if budget == 0 {
                    break 'outer;
                }
            }
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> Vec<Arc<WorkerEndpoint>> {
        (0..n)
            .map(|i| {
                Arc::new(WorkerEndpoint::new(&format!("127.0.0.1:{}", 1000 + i), None).unwrap())
            })
            .collect()
    }

    #[test]
    fn same_key_sticks_to_one_worker_while_load_allows() {
        let eps = pool(4);
        let all: Vec<usize> = (0..4).collect();
        let first = pick(PoolPolicy::PrefixAffinity, &eps, &all, 42).unwrap();
        for _ in 0..20 {
            assert_eq!(
                pick(PoolPolicy::PrefixAffinity, &eps, &all, 42),
                Some(first)
            );
        }
        // Different keys spread over the pool.
        let chosen: std::collections::HashSet<usize> = (0..64u64)
            .filter_map(|k| pick(PoolPolicy::PrefixAffinity, &eps, &all, k))
            .collect();
        assert!(chosen.len() >= 3, "{chosen:?}");
    }

    #[test]
    fn overloaded_preferred_worker_spills_to_the_next() {
        let eps = pool(3);
        let all: Vec<usize> = (0..3).collect();
        let first = pick(PoolPolicy::PrefixAffinity, &eps, &all, 7).unwrap();
        let _slots: Vec<_> = (0..10).map(|_| eps[first].acquire()).collect();
        let next = pick(PoolPolicy::PrefixAffinity, &eps, &all, 7).unwrap();
        assert_ne!(next, first);
    }

    #[test]
    fn least_loaded_prefers_the_idle_worker_of_two() {
        let eps = pool(2);
        let _busy: Vec<_> = (0..5).map(|_| eps[0].acquire()).collect();
        for _ in 0..10 {
            assert_eq!(pick(PoolPolicy::LeastLoaded, &eps, &[0, 1], 0), Some(1));
        }
    }
}
