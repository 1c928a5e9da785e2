//! llama-server's slots, chosen by the worker: each request names the slot
//! it runs in (`id_slot`), so the worker knows what every slot holds and
//! its cache report is exact, as it is for the in-process engine. It holds
//! as long as the worker is the engine's only client (the pod-local
//! deployment); another client's request takes a slot the worker does not
//! hear of.
//!
//! The choice mirrors the in-process engine's: a free slot holding the
//! longest prefix of the prompt (in the gateway's prefix blocks), else the
//! free slot used longest ago. Left to itself, llama-server takes the slot
//! whose prompt is most *similar* (a common-subsequence share), which can
//! evict a popular system prompt for a stranger that merely shares the
//! chat template. When every slot is busy (only when the engine has other
//! clients, since admission matches the slots), the slot holding the
//! longest prefix, then the least busy: the engine queues the request
//! behind it.

use std::sync::{Arc, Mutex, MutexGuard};

/// One slot as the worker left it.
#[derive(Debug, Default)]
struct Slot {
    /// The prompt of the last request pinned to it.
    blocks: Arc<[u64]>,
    /// Requests pinned to it that have not ended.
    running: u32,
    /// When it was last chosen, on the table's own clock.
    last_used: u64,
}

#[derive(Debug, Default)]
struct Table {
    slots: Vec<Slot>,
    clock: u64,
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
}

impl Pin {
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The engine took the request: the slot now holds its prompt.
    pub fn accepted(&mut self) {
        self.previous = None;
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut table = self.pins.table();
        if let Some(s) = table.slots.get_mut(self.slot as usize) {
            s.running = s.running.saturating_sub(1);
            // Unless a later request has placed its own prompt there since.
            if let Some(previous) = self.previous.take() {
                if Arc::ptr_eq(&s.blocks, &self.placed) {
                    s.blocks = previous;
                }
            }
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
            table: Mutex::new(Table { slots, clock: 0 }),
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
        // Free first; then the longest shared prefix; then the least
        // busy; then the one used longest ago.
        let best = table
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
            .map_or(0, |(i, _)| i);
        let slot = &mut table.slots[best];
        let previous = std::mem::replace(&mut slot.blocks, Arc::clone(blocks));
        slot.running += 1;
        slot.last_used = clock;
        Pin {
            pins: Arc::clone(self),
            slot: u32::try_from(best).unwrap_or(u32::MAX),
            placed: Arc::clone(blocks),
            previous: Some(previous),
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
