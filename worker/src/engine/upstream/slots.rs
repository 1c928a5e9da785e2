//! llama-server's slots, chosen by the worker: each request names the slot
//! it runs in (`id_slot`), so the worker knows what every slot holds and
//! its cache report is exact, as it is for the in-process engine. It holds
//! as long as the worker is the engine's only client (the pod-local
//! deployment); another client's request takes a slot the worker does not
//! hear of.
//!
//! Until the engine has been measured, a free slot holding the longest
//! prefix of the prompt (in the gateway's prefix blocks), else the free
//! slot used longest ago. Left to itself, llama-server takes the slot whose
//! prompt is most *similar* (a common-subsequence share), which can evict a
//! popular system prompt for a stranger that merely shares the chat
//! template.
//!
//! Once the worker has timed the engine's prefill and how long a request
//! keeps its slot, the slot with the lowest expected cost in time: the wait
//! for it (a busy slot: the rest of its request; llama-server queues a
//! request named for a busy slot behind it), the prefill of the blocks it
//! lacks, and what overwriting it loses (how often prompts with its head
//! came lately × the blocks they reused there × the prefill rate). On a CPU,
//! where a cold prefill takes seconds and a cached one a fraction of that,
//! a hot prompt waits for its slot instead of evicting another app's
//! prompt from the free one; on a GPU, where prefill is cheap beside a
//! wait, it takes the free slot.

use inference_proto::engine_timing::Measured;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Weight of one request in the moving share of requests per prompt head
/// (about the last 30 requests).
const DEMAND_WEIGHT: f64 = 1.0 / 32.0;

/// How many later requests a prompt left in a slot is expected to serve,
/// per unit of its head's share of requests: overwriting it costs that many
/// prefills of what they would reuse. Higher keeps popular prompts longer
/// at the price of waits.
const EVICTION_HORIZON: f64 = 10.0;

/// Prompt heads whose demand is remembered.
const MAX_HEADS: usize = 256;

/// One slot as the worker left it.
#[derive(Debug, Default)]
struct Slot {
    /// The prompt of the last request pinned to it.
    blocks: Arc<[u64]>,
    /// Requests pinned to it that have not ended.
    running: u32,
    /// When the oldest of them was pinned.
    busy_since: Option<Instant>,
    /// When it was last chosen, on the table's own clock.
    last_used: u64,
}

/// How often prompts with one head (first block) came lately, and how many
/// blocks they reused from a slot when they found one holding their head.
#[derive(Debug, Clone, Copy)]
struct Demand {
    share: f64,
    /// The table's clock at the last update (the share decays per request).
    at: u64,
    reused_blocks: usize,
}

#[derive(Debug, Default)]
struct Table {
    slots: Vec<Slot>,
    clock: u64,
    /// The engine's speed as measured on its requests.
    speed: Measured,
    demand: HashMap<u64, Demand>,
}

impl Table {
    /// The share of recent requests whose prompt starts with `head`.
    fn share(&self, head: u64) -> Option<Demand> {
        self.demand.get(&head).map(|d| Demand {
            share: d.share * (1.0 - DEMAND_WEIGHT).powf((self.clock - d.at) as f64),
            ..*d
        })
    }

    fn record_demand(&mut self, blocks: &[u64], reused: Option<usize>) {
        let Some(&head) = blocks.first() else {
            return;
        };
        let mut d = self.share(head).unwrap_or(Demand {
            share: 0.0,
            at: self.clock,
            reused_blocks: 0,
        });
        d.share += DEMAND_WEIGHT;
        d.at = self.clock;
        if let Some(r) = reused {
            d.reused_blocks = r;
        }
        if self.demand.len() >= MAX_HEADS && !self.demand.contains_key(&head) {
            let clock = self.clock;
            let faded = self
                .demand
                .iter()
                .map(|(&k, v)| {
                    (
                        k,
                        v.share * (1.0 - DEMAND_WEIGHT).powf((clock - v.at) as f64),
                    )
                })
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(k, _)| k);
            if let Some(k) = faded {
                self.demand.remove(&k);
            }
        }
        self.demand.insert(head, d);
    }

    /// The expected cost in nanoseconds of running `blocks` in `slot`.
    fn cost(&self, slot: &Slot, blocks: &[u64], now: Instant) -> f64 {
        let speed = self.speed;
        let wait = match slot.busy_since {
            Some(since) if slot.running > 0 => {
                let age = now.saturating_duration_since(since);
                speed.remaining_ns(age) + f64::from(slot.running - 1) * speed.hold_ns
            }
            _ => 0.0,
        };
        let shared = shared(&slot.blocks, blocks);
        let prefill = speed.prefill_ns(blocks.len() - shared);
        let lost = slot
            .blocks
            .first()
            .and_then(|&head| self.share(head))
            .map_or(0.0, |d| {
                let lost_blocks = d.reused_blocks.saturating_sub(shared) as f64;
                EVICTION_HORIZON * d.share * lost_blocks * speed.prefill_ns_per_block
            });
        wait + prefill + lost
    }
}

/// The engine's slots; shared by every request of the engine.
#[derive(Debug)]
pub struct SlotPins {
    table: Mutex<Table>,
}

/// A request's slot, held until the request ends.
#[derive(Debug)]
pub struct Pin {
    pins: Arc<SlotPins>,
    slot: u32,
    /// The prompt this pin placed in the slot.
    placed: Arc<[u64]>,
    /// What the slot held before; put back if the engine never takes the
    /// request (a refusal before its reply starts).
    previous: Option<Arc<[u64]>>,
    /// Blocks the engine had to prefill (the prompt past what the slot held).
    missing_blocks: usize,
    pinned_at: Instant,
    /// The slot was free when pinned: its times are the engine's, not a
    /// wait for the slot.
    alone: bool,
    /// When the engine's first event came; `None` before.
    answered_at: Option<Instant>,
}

impl Pin {
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The engine took the request: the slot now holds its prompt.
    pub fn accepted(&mut self) {
        self.previous = None;
    }

    /// The engine's first event: the prompt's prefill is done (its time
    /// includes any wait for the slot, which a slot chosen busy adds).
    pub fn answered(&mut self) {
        if self.answered_at.is_none() {
            self.answered_at = Some(Instant::now());
        }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut table = self.pins.table();
        let taken = self.previous.is_none();
        if let Some(s) = table.slots.get_mut(self.slot as usize) {
            s.running = s.running.saturating_sub(1);
            s.busy_since = (s.running > 0).then(Instant::now);
            // Unless a later request has placed its own prompt there since.
            if let Some(previous) = self.previous.take() {
                if Arc::ptr_eq(&s.blocks, &self.placed) {
                    s.blocks = previous;
                }
            }
        }
        // Speed from requests that found their slot free and prefilled
        // enough for the time to be mostly prefill.
        if let (true, true, Some(answered)) = (taken, self.alone, self.answered_at) {
            table.speed.record(
                self.pinned_at.elapsed(),
                answered.saturating_duration_since(self.pinned_at),
                self.missing_blocks as f64,
            );
        }
    }
}

/// Leading blocks two prompts share (the hashes are chained, so the first
/// difference ends the common prefix).
fn shared(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl SlotPins {
    pub fn new(slots: u32) -> Arc<Self> {
        let slots = (0..slots.max(1)).map(|_| Slot::default()).collect();
        Arc::new(Self {
            table: Mutex::new(Table {
                slots,
                ..Table::default()
            }),
        })
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Every update leaves the table consistent: a panic elsewhere
        // cannot corrupt it.
        match self.table.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Chooses the slot for a prompt and records it there.
    pub fn pin(self: &Arc<Self>, blocks: &Arc<[u64]>) -> Pin {
        let mut table = self.table();
        table.clock += 1;
        let clock = table.clock;
        let now = Instant::now();
        let best = if table.speed.is_measured() {
            // The cheapest; among equals, the one used longest ago.
            table
                .slots
                .iter()
                .enumerate()
                .map(|(i, s)| (i, table.cost(s, blocks, now), s.last_used))
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)))
                .map_or(0, |(i, _, _)| i)
        } else {
            // Free first; then the longest shared prefix; then the least
            // busy; then the one used longest ago.
            table
                .slots
                .iter()
                .enumerate()
                .max_by_key(|(_, s)| {
                    (
                        s.running == 0,
                        shared(&s.blocks, blocks),
                        std::cmp::Reverse(s.running),
                        std::cmp::Reverse(s.last_used),
                    )
                })
                .map_or(0, |(i, _)| i)
        };
        let reused = shared(&table.slots[best].blocks, blocks);
        table.record_demand(blocks, (reused > 0).then_some(reused));
        let slot = &mut table.slots[best];
        let previous = std::mem::replace(&mut slot.blocks, Arc::clone(blocks));
        let alone = slot.running == 0;
        if alone {
            slot.busy_since = Some(now);
        }
        slot.running += 1;
        slot.last_used = clock;
        Pin {
            pins: Arc::clone(self),
            slot: u32::try_from(best).unwrap_or(u32::MAX),
            placed: Arc::clone(blocks),
            previous: Some(previous),
            missing_blocks: blocks.len() - reused,
            pinned_at: now,
            alone,
            answered_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(v: &[u64]) -> Arc<[u64]> {
        v.into()
    }

    /// A pin the engine took.
    fn taken(pins: &Arc<SlotPins>, prompt: &[u64]) -> Pin {
        let mut pin = pins.pin(&blocks(prompt));
        pin.accepted();
        pin
    }

    #[test]
    fn a_prompt_goes_back_to_the_slot_holding_its_prefix() {
        let pins = SlotPins::new(2);
        let a = taken(&pins, &[1, 2]);
        let b = taken(&pins, &[7, 8]);
        assert_ne!(a.slot(), b.slot(), "a free slot before a busy one");
        let (sa, sb) = (a.slot(), b.slot());
        drop((a, b));
        // The next turn of each conversation finds its own slot.
        assert_eq!(taken(&pins, &[7, 8, 9]).slot(), sb);
        assert_eq!(taken(&pins, &[1, 2, 3]).slot(), sa);
    }

    #[test]
    fn a_stranger_takes_the_slot_used_longest_ago() {
        let pins = SlotPins::new(2);
        let old = taken(&pins, &[1]).slot();
        let recent = taken(&pins, &[2]).slot();
        assert_ne!(old, recent);
        // Both free now; the popular prefix [2] was used last and stays.
        assert_eq!(taken(&pins, &[3]).slot(), old);
        assert_eq!(taken(&pins, &[2, 5]).slot(), recent);
    }

    #[test]
    fn a_busy_slot_is_chosen_only_when_every_slot_is_busy() {
        let pins = SlotPins::new(2);
        let held = taken(&pins, &[1, 2]);
        // Its prefix is in the busy slot: the free one serves it now.
        let other = taken(&pins, &[1, 2, 3]);
        assert_ne!(held.slot(), other.slot());
        // Both busy: the one holding the longest prefix queues it.
        let queued = taken(&pins, &[1, 2, 3, 4]);
        assert_eq!(queued.slot(), other.slot());
        drop((held, other, queued));
        let table = pins.table();
        assert!(table.slots.iter().all(|s| s.running == 0), "pins released");
    }

    /// An engine measured at `prefill_ms` per block and `hold_ms` per
    /// request.
    fn measured(pins: &Arc<SlotPins>, prefill_ms: f64, hold_ms: f64) {
        pins.table().speed = Measured {
            prefill_ns_per_block: prefill_ms * 1e6,
            hold_ns: hold_ms * 1e6,
        };
    }

    /// A prompt of `app`'s 8-block head and a unique tail.
    fn app_prompt(app: u64, tail: u64) -> Vec<u64> {
        let mut p: Vec<u64> = (0..8).map(|b| app * 100 + b).collect();
        p.push(1_000_000 + tail);
        p
    }

    #[test]
    fn on_a_slow_prefill_a_hot_prompt_waits_for_its_slot_instead_of_evicting_another() {
        // A CPU: a block of prefill costs 100 ms, a request holds its slot
        // 300 ms. App 1 is asked often; app 2 now and then.
        let pins = SlotPins::new(2);
        measured(&pins, 100.0, 300.0);
        let mut tail = 0;
        let mut ask = |app: u64| {
            tail += 1;
            taken(&pins, &app_prompt(app, tail))
        };
        let (one, two) = (ask(1), ask(2));
        let (s1, s2) = (one.slot(), two.slot());
        drop((one, two));
        for _ in 0..6 {
            drop(ask(1));
        }
        drop(ask(2));
        let running = ask(1);
        assert_eq!(running.slot(), s1);
        // App 1 again while its slot is busy: the wait (~300 ms) is far
        // below prefilling its 8 blocks (800 ms) and losing app 2's.
        let queued = ask(1);
        assert_eq!(queued.slot(), s1, "waits for the slot holding its head");
        assert_eq!(ask(2).slot(), s2, "app 2's prompt is still there");
    }

    #[test]
    fn on_a_fast_prefill_a_hot_prompt_takes_the_free_slot() {
        // A GPU: a block of prefill costs 0.1 ms, a request holds its slot
        // for 2 s.
        let pins = SlotPins::new(2);
        measured(&pins, 0.1, 2000.0);
        let running = taken(&pins, &app_prompt(1, 1));
        let other = taken(&pins, &app_prompt(1, 2));
        assert_ne!(running.slot(), other.slot(), "prefill beats a 2 s wait");
    }

    #[test]
    fn the_engine_is_timed_on_requests_that_found_their_slot_free() {
        let pins = SlotPins::new(1);
        let mut first = taken(&pins, &app_prompt(1, 1));
        let mut queued = taken(&pins, &app_prompt(2, 2));
        std::thread::sleep(std::time::Duration::from_millis(20));
        first.answered();
        queued.answered();
        drop(first);
        let speed = pins.table().speed;
        assert!(speed.hold_ns >= 20e6, "{speed:?}");
        assert!(speed.prefill_ns_per_block >= 20e6 / 9.0, "{speed:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(queued);
        let after = pins.table().speed;
        assert_eq!(
            after.hold_ns, speed.hold_ns,
            "a wait for the slot is no sample"
        );
    }

    #[test]
    fn a_refused_request_gives_its_slot_back() {
        let pins = SlotPins::new(1);
        let slot = taken(&pins, &[1, 2]).slot();
        // The engine refuses the next prompt: the slot still holds [1, 2].
        drop(pins.pin(&blocks(&[7])));
        let table = pins.table();
        assert_eq!(&*table.slots[slot as usize].blocks, &[1, 2]);
        assert_eq!(table.slots[slot as usize].running, 0);
    }

    #[test]
    fn a_refusal_does_not_undo_a_later_placement() {
        let pins = SlotPins::new(1);
        let refused = pins.pin(&blocks(&[1]));
        // Queued behind it on the one slot, and taken by the engine.
        let later = taken(&pins, &[2, 3]);
        drop(refused);
        let table = pins.table();
        assert_eq!(&*table.slots[later.slot() as usize].blocks, &[2, 3]);
    }
}
