//! Worker selection policies.
//!
//! Every policy ends in the same session rule ([`session_worker`]): where
//! the policy itself has no choice, a request that names its conversation
//! keeps to that conversation's worker while load allows; then the least
//! loaded of two.
//!
//! - `LeastLoaded`: power of two choices over the load score. Cheap, and
//!   avoids the herd behaviour of always picking the global minimum.
//! - `PrefixAffinity`: rendezvous hashing on an affinity key (cache key,
//!   session, or a hash of the prompt's head) with bounded load: a key sticks
//!   to its worker so the worker's prefix cache hits, unless that worker
//!   carries more than `LOAD_FACTOR` × the average; then the next worker in
//!   the key's order takes it.
//! - `CacheAware` (the default): on what the engines report they hold.
//!   The prompt's block hashes ([`inference_proto::prefix`]) against each
//!   worker's cached prefixes give the prefill each worker would save.
//!   Once this gateway has measured the engines (prefill time per block
//!   and how long a request keeps a slot, `timing.rs`; one not measured
//!   yet is taken at the others' mean), the cost of a worker is the
//!   expected time to first token: the wait for a slot, then the prefill
//!   it lacks (a block more per request beside it). On an engine whose
//!   cached prefix serves one sequence at a time (llama-server's slots),
//!   a request may also wait behind the running request that holds its
//!   prefix, as the worker pins it there when that is cheaper. A busy
//!   engine holding the prefix then wins when its wait is shorter than
//!   the prefill it saves (on CPUs, where prefill is slow), and a hot
//!   prefix spreads to a free engine when it is not (on GPUs). Before
//!   that, the cost is the prompt bytes left to prefill plus
//!   `LOAD_COST_BYTES` per request carried, and a worker that would queue
//!   is passed over while another sits idle (the load gate). A prompt
//!   nobody holds any block of goes where `PrefixAffinity` would send it
//!   (its head's rendezvous order, load gate applied), so one app's
//!   prompts keep meeting on one engine. A prompt shorter than one block
//!   has nothing to match: the session rule decides.

use super::endpoint::WorkerEndpoint;
use super::timing::Measured;
use crate::config::PoolPolicy;
use inference_proto::prefix::{self, BLOCK_BYTES};
use inference_proto::v1 as pb;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A worker may carry this factor over the pool's average before a sticky
/// key spills to its next-preferred worker.
const LOAD_FACTOR: f64 = 1.25;

/// What one more request on a worker costs in `CacheAware`, in prompt
/// bytes to prefill (about 128 tokens): a request sharing the engine's
/// compute slows the others, so a worker already busy must save more
/// prefill than that to win.
const LOAD_COST_BYTES: usize = 512;

/// What one request running beside another on an engine costs it in the
/// timed model, in prefill blocks (about 32 tokens): a tie-breaker toward
/// the less busy engine more than a price, since a held prefix saves far
/// more than the engine loses to a neighbour (on one CPU thread as on a
/// GPU batch).
const BESIDE_COST_BLOCKS: f64 = 1.0;

/// What selection needs of one request, computed once per request.
pub struct Routing {
    affinity_key: u64,
    /// The key is the request's own conversation (an explicit cache key),
    /// not a hash of its prompt's head.
    named: bool,
    /// The prompt's block hashes (`CacheAware` only; empty otherwise).
    blocks: Arc<[u64]>,
}

impl Routing {
    pub fn of(policy: PoolPolicy, request: &pb::GenerateRequest) -> Self {
        let blocks = match policy {
            PoolPolicy::CacheAware => prefix::prompt_blocks(request).into(),
            PoolPolicy::LeastLoaded | PoolPolicy::PrefixAffinity => Arc::from([]),
        };
        Self {
            affinity_key: affinity_key(request),
            named: !request.cache_key.is_empty(),
            blocks,
        }
    }

    /// The prompt's block hashes, to record as sent to the chosen worker.
    pub fn prompt_blocks(&self) -> Arc<[u64]> {
        Arc::clone(&self.blocks)
    }

    /// How many blocks the prompt has (0 outside `CacheAware`).
    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }
}

/// Picks among `candidates` (indices into `endpoints`).
pub fn pick(
    policy: PoolPolicy,
    endpoints: &[Arc<WorkerEndpoint>],
    candidates: &[usize],
    routing: &Routing,
) -> Option<usize> {
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0]),
        _ => {
            let by_policy = match policy {
                PoolPolicy::LeastLoaded => None,
                PoolPolicy::PrefixAffinity => {
                    bounded_rendezvous(endpoints, candidates, routing.affinity_key)
                }
                // `None` for a prompt under one block: nothing to match.
                PoolPolicy::CacheAware => cache_aware(endpoints, candidates, routing),
            };
            by_policy
                .or_else(|| session_worker(endpoints, candidates, routing))
                .or_else(|| Some(two_choices(endpoints, candidates)))
        }
    }
}

/// The session rule every policy applies where its own choice gives
/// none: a request that names its conversation (`prompt_cache_key`,
/// `x-session-id`, a WebSocket connection's turns) keeps to that
/// conversation's worker while its load allows, since its engine holds
/// the conversation and another would prefill all of it.
fn session_worker(
    endpoints: &[Arc<WorkerEndpoint>],
    candidates: &[usize],
    routing: &Routing,
) -> Option<usize> {
    routing
        .named
        .then(|| bounded_rendezvous(endpoints, candidates, routing.affinity_key))
        .flatten()
}

/// The cheapest worker for a prompt; `None` for a prompt below one block.
/// Once an engine of the pool has been measured, in time
/// ([`timed_choice`]); before that, or when nobody holds any of it, in
/// prefill bytes behind the load gate ([`gated_cost`], rendezvous).
fn cache_aware(
    endpoints: &[Arc<WorkerEndpoint>],
    candidates: &[usize],
    routing: &Routing,
) -> Option<usize> {
    let blocks = &routing.blocks[..];
    if blocks.is_empty() {
        return None;
    }
    let matched: Vec<(usize, usize)> = candidates
        .iter()
        .map(|&i| (i, endpoints[i].prefixes().matched(blocks)))
        .collect();
    if let Some(i) = timed_choice(endpoints, &matched, blocks) {
        return Some(i);
    }
    let any_idle = candidates.iter().any(|&i| endpoints[i].load_score() == 0);
    // The load gate: never queue while another engine sits idle.
    let gate = |i: usize| !any_idle || endpoints[i].has_free_slot();
    if matched.iter().all(|&(_, m)| m == 0) {
        // Nobody holds any of it free: where this prompt's head (or cache
        // key) belongs, so the prompts of one app keep meeting on one
        // engine instead of each engine seeing every app. If not even a
        // running request holds it, there is no prefill to save: never
        // into a queue while a slot is free elsewhere.
        let held_running = candidates
            .iter()
            .any(|&i| endpoints[i].prefixes().running_holder(blocks).is_some());
        let any_free = candidates.iter().any(|&i| endpoints[i].has_free_slot());
        let allowed: Vec<usize> = matched
            .iter()
            .map(|&(i, _)| i)
            .filter(|&i| {
                if held_running {
                    gate(i)
                } else {
                    !any_free || endpoints[i].has_free_slot()
                }
            })
            .collect();
        return bounded_rendezvous(endpoints, &allowed, routing.affinity_key);
    }
    cheapest(
        matched
            .iter()
            .filter(|&&(i, _)| gate(i))
            .map(|&(i, m)| (i, gated_cost(&endpoints[i], blocks.len() - m))),
    )
}

/// The worker with the lowest expected time to first token, once some
/// candidate's engine has been measured (prefill at the measured engines'
/// mean rate; an engine's own hold time, else their mean) and some worker
/// holds part of the prompt. On an engine with one sequence per cached
/// prefix (llama-server's slots) the request may also wait for the slot a
/// running request holds its prefix in (the worker pins it there when that
/// is cheaper, `worker/src/engine/upstream/slots.rs`): a hot prompt then
/// queues behind its own slot on a CPU, where its prefill costs more than
/// the wait, and spreads to a free slot on a GPU, where it does not.
fn timed_choice(
    endpoints: &[Arc<WorkerEndpoint>],
    matched: &[(usize, usize)],
    blocks: &[u64],
) -> Option<usize> {
    let speeds: Vec<Option<Measured>> = matched
        .iter()
        .map(|&(i, _)| endpoints[i].times().measured())
        .collect();
    let prior = Measured::mean(speeds.iter().flatten().copied())?;
    let mut any_held = false;
    let mut costs = Vec::with_capacity(matched.len());
    for (&(i, m), speed) in matched.iter().zip(&speeds) {
        let e = &endpoints[i];
        // One prefill rate for the pool: its engines run one model, and
        // per-engine figures differ by measurement noise far more often
        // than by hardware, which would move prefixes for nothing.
        let speed = Measured {
            prefill_ns_per_block: prior.prefill_ns_per_block,
            hold_ns: speed.map_or(prior.hold_ns, |s| s.hold_ns),
        };
        let cost = if e.has_free_slot() {
            let free = timed_cost(e, &speed, blocks.len() - m);
            let behind_holder = e.prefixes().running_holder(blocks).map(|(held, age)| {
                any_held = true;
                speed.remaining_ns(age) + timed_cost(e, &speed, blocks.len() - held)
            });
            any_held |= m > 0;
            behind_holder.map_or(free, |w| w.min(free))
        } else {
            let m = e.prefixes().matched_once_free(blocks);
            any_held |= m > 0;
            e.expected_wait_ns(&speed) + timed_cost(e, &speed, blocks.len() - m)
        };
        costs.push((i, cost, e.load_score()));
    }
    if !any_held {
        return None;
    }
    // Among equal costs the least loaded, so that prompts nothing tells
    // apart still spread.
    let least = costs
        .iter()
        .map(|&(_, c, _)| c)
        .fold(f64::INFINITY, f64::min);
    let fewest = costs
        .iter()
        .filter(|&&(_, c, _)| c == least)
        .map(|&(_, _, load)| load)
        .min()?;
    cheapest(
        costs
            .into_iter()
            .filter(|&(_, c, load)| c == least && load == fewest)
            .map(|(i, c, _)| (i, c)),
    )
}

/// Prefill bytes left to do plus `LOAD_COST_BYTES` per request carried.
fn gated_cost(endpoint: &WorkerEndpoint, missing_blocks: usize) -> f64 {
    (missing_blocks * BLOCK_BYTES + endpoint.load_score() as usize * LOAD_COST_BYTES) as f64
}

/// The prefill of the blocks a worker lacks, in nanoseconds, slowed by the
/// requests it will run beside (`BESIDE_COST_BLOCKS` of prefill each).
/// The wait for a slot is added by the caller.
fn timed_cost(endpoint: &WorkerEndpoint, speed: &Measured, missing_blocks: usize) -> f64 {
    let (_, _, capacity) = endpoint.reported_load();
    let beside = endpoint.load_score().min(capacity.saturating_sub(1));
    (missing_blocks as f64 + f64::from(beside) * BESIDE_COST_BLOCKS) * speed.prefill_ns_per_block
}

/// The lowest cost; among equal ones, one at random (reservoir sampling),
/// so no worker is everyone's first choice when nothing tells them apart.
fn cheapest(costs: impl IntoIterator<Item = (usize, f64)>) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    let mut ties = 0u32;
    for (i, c) in costs {
        match best {
            Some((_, b)) if c > b => {}
            Some((_, b)) if c == b => {
                ties += 1;
                if rand::random_range(0..=ties) == 0 {
                    best = Some((i, c));
                }
            }
            _ => {
                best = Some((i, c));
                ties = 0;
            }
        }
    }
    best.map(|(i, _)| i)
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

    fn keyed(key: u64) -> Routing {
        Routing {
            affinity_key: key,
            named: false,
            blocks: Arc::from([]),
        }
    }

    fn prompt(blocks: &[u64]) -> Routing {
        Routing {
            affinity_key: 0,
            named: false,
            blocks: blocks.into(),
        }
    }

    fn report(e: &WorkerEndpoint, blocks: &[u64], capacity: u32) {
        report_sharing(e, blocks, capacity, true);
    }

    fn report_sharing(e: &WorkerEndpoint, blocks: &[u64], capacity: u32, concurrent_reuse: bool) {
        e.record_check(true, Some((0, 0, capacity, false)));
        e.prefixes().record_report(&pb::PrefixCache {
            epoch: 1,
            block_bytes: BLOCK_BYTES as u32,
            blocks: blocks.to_vec(),
            capacity,
            used: 1,
            source: "exact".into(),
            concurrent_reuse,
        });
    }

    #[test]
    fn cache_aware_goes_where_the_longest_prefix_is_held() {
        let eps = pool(3);
        report(&eps[0], &[1, 2], 4);
        report(&eps[1], &[1, 2, 3, 4], 4);
        report(&eps[2], &[], 4);
        for _ in 0..10 {
            assert_eq!(
                pick(
                    PoolPolicy::CacheAware,
                    &eps,
                    &[0, 1, 2],
                    &prompt(&[1, 2, 3, 4, 5])
                ),
                Some(1)
            );
        }
    }

    #[test]
    fn cache_aware_weighs_saved_prefill_against_load() {
        let eps = pool(2);
        report(&eps[0], &[1, 2], 8);
        report(&eps[1], &[], 8);
        // Two blocks saved (256 bytes) do not pay for one request ahead.
        let _busy = eps[0].acquire();
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&[1, 2, 3])),
            Some(1)
        );
        // Eight do.
        report(&eps[0], &[1, 2, 3, 4, 5, 6, 7, 8], 8);
        assert_eq!(
            pick(
                PoolPolicy::CacheAware,
                &eps,
                &[0, 1],
                &prompt(&[1, 2, 3, 4, 5, 6, 7, 8, 9])
            ),
            Some(0)
        );
    }

    #[test]
    fn a_hot_prefix_spills_to_a_free_slot_instead_of_queueing() {
        let eps = pool(2);
        let long: Vec<u64> = (1..=64).collect();
        report(&eps[0], &long, 2);
        report(&eps[1], &[], 2);
        let _a = eps[0].acquire();
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(0),
            "one slot still free where the prefix is"
        );
        let _b = eps[0].acquire();
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(1),
            "full: the idle engine wins"
        );
        let _c = eps[1].acquire();
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(0),
            "none idle: a short queue behind the prefix beats its prefill"
        );
        let _d = eps[1].acquire();
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(0),
            "both full: the prefix decides again"
        );
    }

    /// The engine measured: `prefill_ms` to first token per block, a slot
    /// held `hold_ms` per request.
    fn measured(e: &WorkerEndpoint, prefill_ms: u64, hold_ms: u64) {
        e.times().record(super::super::timing::CallSample {
            first_event: std::time::Duration::from_millis(prefill_ms * 4),
            whole: std::time::Duration::from_millis(hold_ms),
            prefilled_blocks: 4.0,
        });
    }

    /// Two engines of two slots: the first holds `held` and has both
    /// slots busy (the guards), the second is idle and holds nothing.
    fn first_full(
        held: &[u64],
        concurrent_reuse: bool,
    ) -> (
        Vec<Arc<WorkerEndpoint>>,
        Vec<super::super::endpoint::InflightSlot>,
    ) {
        let eps = pool(2);
        report_sharing(&eps[0], held, 2, concurrent_reuse);
        report_sharing(&eps[1], &[], 2, concurrent_reuse);
        let busy = (0..2).map(|_| eps[0].acquire()).collect();
        (eps, busy)
    }

    #[test]
    fn measured_engines_wait_for_a_held_prefix_when_the_wait_is_shorter_than_its_prefill() {
        let long: Vec<u64> = (1..=10).collect();
        // A CPU: 100 ms of prefill per block, a slot held 400 ms.
        let (eps, _busy) = first_full(&long, true);
        for e in &eps {
            measured(e, 100, 400);
        }
        // Waiting up to 400 ms and running beside one (a block's worth)
        // beats prefilling ten blocks (1 s) on the idle engine.
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(0)
        );
        // A GPU: 1 ms per block, a slot held 2 s: the idle engine.
        let (eps, _busy) = first_full(&long, true);
        for e in &eps {
            measured(e, 1, 2000);
        }
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(1)
        );
    }

    #[test]
    fn a_full_slot_engine_is_waited_for_when_a_running_request_holds_the_prefix() {
        let long: Vec<u64> = (1..=10).collect();
        let (eps, _busy) = first_full(&long, false);
        for e in &eps {
            measured(e, 100, 400);
        }
        // Both slots of engine 0 run, one of them on this prefix: the
        // worker queues the request for that slot, which keeps the prefix.
        let _running = eps[0].prefixes().start_running(long.clone().into());
        assert_eq!(eps[0].prefixes().matched(&long), 0);
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(0)
        );
    }

    #[test]
    fn a_slot_engine_with_a_free_slot_is_chosen_to_wait_behind_the_holder_on_a_cpu() {
        let long: Vec<u64> = (1..=10).collect();
        let eps = pool(2);
        report_sharing(&eps[0], &long, 2, false);
        report_sharing(&eps[1], &[], 2, false);
        // Engine 0 runs one request on this prefix; its other slot is free
        // and holds nothing of it, like the idle engine 1.
        let _slot = eps[0].acquire();
        let _running = eps[0].prefixes().start_running(long.clone().into());
        assert!(eps[0].has_free_slot());
        assert_eq!(
            eps[0].prefixes().matched(&long),
            0,
            "busy: not reusable now"
        );
        for e in &eps {
            measured(e, 100, 400);
        }
        // A CPU: the rest of a 400 ms hold beats prefilling ten blocks,
        // whichever engine the prompt's head would hash to.
        for key in 0..16 {
            let routing = Routing {
                affinity_key: key,
                named: false,
                blocks: long.clone().into(),
            };
            assert_eq!(
                pick(PoolPolicy::CacheAware, &eps, &[0, 1], &routing),
                Some(0),
                "key {key}"
            );
        }
        // A GPU: 1 ms a block, a 2 s hold: the idle engine prefills it.
        for e in &eps {
            for _ in 0..64 {
                measured(e, 1, 2000);
            }
        }
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(1)
        );
    }

    #[test]
    fn a_prompt_nobody_holds_never_queues_while_a_slot_is_free_elsewhere() {
        let eps = pool(2);
        report_sharing(&eps[0], &[], 2, false);
        report_sharing(&eps[1], &[], 2, false);
        // Engine 0 full, engine 1 running one: neither idle.
        let _busy: Vec<_> = (0..2).map(|_| eps[0].acquire()).collect();
        let _one = eps[1].acquire();
        for key in 0..32 {
            let routing = Routing {
                affinity_key: key,
                named: false,
                blocks: vec![1000 + key, 2000 + key].into(),
            };
            assert_eq!(
                pick(PoolPolicy::CacheAware, &eps, &[0, 1], &routing),
                Some(1),
                "key {key}"
            );
        }
    }

    #[test]
    fn cache_aware_keeps_a_named_conversation_s_short_prompts_on_its_worker() {
        let eps = pool(3);
        for e in &eps {
            report(e, &[], 4);
        }
        let named = Routing {
            affinity_key: 42,
            named: true,
            blocks: Arc::from([]),
        };
        let first = pick(PoolPolicy::CacheAware, &eps, &[0, 1, 2], &named);
        for _ in 0..20 {
            assert_eq!(
                pick(PoolPolicy::CacheAware, &eps, &[0, 1, 2], &named),
                first
            );
        }
    }

    #[test]
    fn a_pool_measured_nowhere_keeps_the_load_gate() {
        let long: Vec<u64> = (1..=10).collect();
        let (eps, _busy) = first_full(&long, true);
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(1)
        );
        // One engine measured (a CPU): the other is taken at its speed,
        // and the wait for the held prefix wins.
        measured(&eps[0], 100, 400);
        assert_eq!(
            pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&long)),
            Some(0)
        );
    }

    #[test]
    fn prompts_nobody_holds_go_where_their_head_belongs() {
        let eps = pool(4);
        for e in &eps {
            report(e, &[], 4);
        }
        let all = [0, 1, 2, 3];
        let of = |key: u64| Routing {
            affinity_key: key,
            named: false,
            blocks: Arc::from([9u64]),
        };
        let first = pick(PoolPolicy::CacheAware, &eps, &all, &of(5));
        for _ in 0..10 {
            assert_eq!(pick(PoolPolicy::CacheAware, &eps, &all, &of(5)), first);
        }
        let chosen: std::collections::HashSet<usize> = (0..64)
            .filter_map(|k| pick(PoolPolicy::CacheAware, &eps, &all, &of(k)))
            .collect();
        assert!(chosen.len() >= 3, "{chosen:?}");
        // Below one block: least loaded.
        let _busy: Vec<_> = (0..3).map(|_| eps[0].acquire()).collect();
        for _ in 0..10 {
            assert_ne!(
                pick(PoolPolicy::CacheAware, &eps, &[0, 1], &prompt(&[])),
                Some(0)
            );
        }
    }

    #[test]
    fn same_key_sticks_to_one_worker_while_load_allows() {
        let eps = pool(4);
        let all: Vec<usize> = (0..4).collect();
        let first = pick(PoolPolicy::PrefixAffinity, &eps, &all, &keyed(42)).unwrap();
        for _ in 0..20 {
            assert_eq!(
                pick(PoolPolicy::PrefixAffinity, &eps, &all, &keyed(42)),
                Some(first)
            );
        }
        // Different keys spread over the pool.
        let chosen: std::collections::HashSet<usize> = (0..64u64)
            .filter_map(|k| pick(PoolPolicy::PrefixAffinity, &eps, &all, &keyed(k)))
            .collect();
        assert!(chosen.len() >= 3, "{chosen:?}");
    }

    #[test]
    fn overloaded_preferred_worker_spills_to_the_next() {
        let eps = pool(3);
        let all: Vec<usize> = (0..3).collect();
        let first = pick(PoolPolicy::PrefixAffinity, &eps, &all, &keyed(7)).unwrap();
        let _slots: Vec<_> = (0..10).map(|_| eps[first].acquire()).collect();
        let next = pick(PoolPolicy::PrefixAffinity, &eps, &all, &keyed(7)).unwrap();
        assert_ne!(next, first);
    }

    #[test]
    fn least_loaded_keeps_a_named_conversation_on_its_worker_while_load_allows() {
        let eps = pool(4);
        let all = [0, 1, 2, 3];
        let conversation = Routing {
            affinity_key: 11,
            named: true,
            blocks: Arc::from([]),
        };
        let first = pick(PoolPolicy::LeastLoaded, &eps, &all, &conversation).unwrap();
        // Other requests elsewhere do not move it.
        let _elsewhere = eps[(first + 1) % 4].acquire();
        for _ in 0..10 {
            assert_eq!(
                pick(PoolPolicy::LeastLoaded, &eps, &all, &conversation),
                Some(first)
            );
        }
        // Past its share of the load, it spills like any sticky key.
        let _more: Vec<_> = (0..10).map(|_| eps[first].acquire()).collect();
        assert_ne!(
            pick(PoolPolicy::LeastLoaded, &eps, &all, &conversation),
            Some(first)
        );
    }

    #[test]
    fn least_loaded_prefers_the_idle_worker_of_two() {
        let eps = pool(2);
        let _busy: Vec<_> = (0..5).map(|_| eps[0].acquire()).collect();
        for _ in 0..10 {
            assert_eq!(
                pick(PoolPolicy::LeastLoaded, &eps, &[0, 1], &keyed(0)),
                Some(1)
            );
        }
    }
}
