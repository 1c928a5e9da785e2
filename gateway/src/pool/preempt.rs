//! Preemption: when a request of a higher tier waits and every slot of its
//! pool holds lower-tier work, the pool stops one of those generations on
//! its worker, gives its slot to the waiting request, and the stopped
//! generation resumes through the migration path once a slot frees
//! (`generation::Generation::run`). Its client sees a pause.
//!
//! The queue keeps the running generations that may be preempted (a
//! [`Lever`] each, registered by the relay once the call runs); the relay
//! watches its lever and, when it is pulled, cancels the call on its worker
//! and hands the generation back to the driver.

use crate::accounts::ServiceTier;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Notify;

/// Who may be preempted, per pool (`[models.*]` `preempt_tiers`,
/// `max_preemptions`).
#[derive(Debug, Clone, Copy)]
pub struct PreemptPolicy {
    /// By tier (index: `ServiceTier as usize`): whether its generations may
    /// be preempted. Never `priority` (the config refuses it).
    pub tiers: [bool; 3],
    /// Times one generation may be preempted; 0 turns preemption off.
    pub max_per_generation: u32,
}

impl PreemptPolicy {
    /// No preemption.
    pub const OFF: PreemptPolicy = PreemptPolicy {
        tiers: [false; 3],
        max_per_generation: 0,
    };

    /// Whether a generation of `tier` preempted `preemptions` times so far
    /// may be preempted again.
    pub fn allows(&self, tier: ServiceTier, preemptions: u32) -> bool {
        tier != ServiceTier::Priority
            && self.tiers[tier as usize]
            && preemptions < self.max_per_generation
    }
}

/// A running generation's handle: the queue pulls it, the relay watches
/// it and tells it what the generation delivered.
#[derive(Debug, Default)]
pub struct Lever {
    pulled: AtomicBool,
    notify: Notify,
    /// Output tokens delivered so far: the cheapest generation to resume
    /// is the one with the least.
    delivered: AtomicU64,
    /// Whether its engine could continue it from what it delivered now
    /// (an engine server continues a text answer only).
    resumable: AtomicBool,
}

impl Lever {
    /// What the generation delivered so far, and whether a worker could
    /// continue it from there.
    pub fn note(&self, delivered_tokens: u64, resumable: bool) {
        self.delivered.store(delivered_tokens, Ordering::Relaxed);
        self.resumable.store(resumable, Ordering::Relaxed);
    }

    /// Resolves once the lever is pulled (at once if it already was).
    pub async fn pulled(&self) {
        loop {
            let notified = self.notify.notified();
            if self.pulled.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// Whether its engine could continue it now (as last noted).
    pub fn is_resumable(&self) -> bool {
        self.resumable.load(Ordering::Relaxed)
    }

    pub fn is_pulled(&self) -> bool {
        self.pulled.load(Ordering::Acquire)
    }

    fn pull(&self) {
        self.pulled.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}

/// A running generation that may be preempted.
struct Candidate {
    tier: ServiceTier,
    /// Times it was preempted before.
    preemptions: u32,
    since: Instant,
    lever: Arc<Lever>,
}

/// The pool's preemptible generations, and the ones pulled whose slot has
/// not come free yet (each will serve one waiter).
#[derive(Default)]
pub(super) struct Preemptible {
    running: HashMap<u64, Candidate>,
    pulled: u32,
}

impl Preemptible {
    pub(super) fn register(
        &mut self,
        id: u64,
        tier: ServiceTier,
        preemptions: u32,
        lever: Arc<Lever>,
    ) {
        self.running.insert(
            id,
            Candidate {
                tier,
                preemptions,
                since: Instant::now(),
                lever,
            },
        );
    }

    /// The generation's call ended (finished, moved, preempted, left).
    pub(super) fn remove(&mut self, id: u64) {
        if let Some(c) = self.running.remove(&id) {
            if c.lever.is_pulled() {
                self.pulled = self.pulled.saturating_sub(1);
            }
        }
    }

    /// Running generations that may still be preempted, or were and hold
    /// their slot until their call ends: what the peers count on this
    /// replica to serve its own waiters with (`peers::Entry::levers`).
    pub(super) fn holding(&self) -> u32 {
        let pullable = self
            .running
            .values()
            .filter(|c| !c.lever.is_pulled() && c.lever.is_resumable())
            .count();
        self.pulled
            .saturating_add(u32::try_from(pullable).unwrap_or(u32::MAX))
    }

    /// Whether any running generation may still be preempted.
    pub(super) fn any_pullable(&self) -> bool {
        self.running
            .values()
            .any(|c| !c.lever.is_pulled() && c.lever.is_resumable())
    }

    /// Preempts for `waiting` (the tiers of the requests waiting, best
    /// first) what `free` slots and the generations already pulled do not
    /// serve: for each, the running generation of the lowest tier below
    /// it, of those the one preempted least often (a generation spends its
    /// preemptions, and one that has none left can no longer make room: a
    /// burst of higher-tier requests then finds every slot held), then the
    /// one that delivered least, then the newest. Returns the tiers of
    /// those it preempted.
    pub(super) fn preempt_for(
        &mut self,
        waiting: impl Iterator<Item = ServiceTier>,
        free: u32,
    ) -> Vec<ServiceTier> {
        let mut covered = free.saturating_add(self.pulled);
        let mut preempted = Vec::new();
        for tier in waiting {
            if covered > 0 {
                covered -= 1;
                continue;
            }
            let victim = self
                .running
                .values()
                .filter(|c| c.tier < tier && !c.lever.is_pulled() && c.lever.is_resumable())
                .min_by(|a, b| {
                    a.tier
                        .cmp(&b.tier)
                        .then_with(|| a.preemptions.cmp(&b.preemptions))
                        .then_with(|| {
                            let d = |c: &Candidate| c.lever.delivered.load(Ordering::Relaxed);
                            d(a).cmp(&d(b))
                        })
                        .then_with(|| b.since.cmp(&a.since))
                });
            // The waiters are best first: one that finds nobody below it
            // leaves none for those after it.
            let Some(victim) = victim else {
                break;
            };
            victim.lever.pull();
            self.pulled += 1;
            preempted.push(victim.tier);
        }
        preempted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lever(delivered: u64) -> Arc<Lever> {
        let l = Arc::new(Lever::default());
        l.note(delivered, true);
        l
    }

    #[test]
    fn the_lowest_tier_that_delivered_least_goes_first() {
        let mut p = Preemptible::default();
        let (a, b, c) = (lever(50), lever(5), lever(1));
        p.register(1, ServiceTier::Flex, 0, Arc::clone(&a));
        p.register(2, ServiceTier::Flex, 0, Arc::clone(&b));
        p.register(3, ServiceTier::Default, 0, Arc::clone(&c));
        let got = p.preempt_for([ServiceTier::Priority].into_iter(), 0);
        assert_eq!(got, vec![ServiceTier::Flex]);
        assert!(b.is_pulled() && !a.is_pulled() && !c.is_pulled());
        // The pulled one covers the same waiter next time: nothing more.
        assert!(p
            .preempt_for([ServiceTier::Priority].into_iter(), 0)
            .is_empty());
        // Its slot freed: the count of pulled ones goes down with it.
        p.remove(2);
        assert_eq!(p.pulled, 0);
    }

    #[test]
    fn nobody_of_the_same_tier_or_above_nor_an_unresumable_one_is_preempted() {
        let mut p = Preemptible::default();
        let stuck = Arc::new(Lever::default());
        stuck.note(3, false);
        p.register(1, ServiceTier::Flex, 0, Arc::clone(&stuck));
        p.register(2, ServiceTier::Default, 0, lever(0));
        assert!(p
            .preempt_for([ServiceTier::Default].into_iter(), 0)
            .is_empty());
        assert!(!stuck.is_pulled());
        // A free slot serves the waiter without anyone stopping.
        assert!(p
            .preempt_for([ServiceTier::Priority].into_iter(), 1)
            .is_empty());
        assert_eq!(
            p.preempt_for([ServiceTier::Priority].into_iter(), 0),
            vec![ServiceTier::Default]
        );
    }

    #[test]
    fn a_policy_never_preempts_priority_and_counts_preemptions() {
        let p = PreemptPolicy {
            tiers: [true, true, true],
            max_per_generation: 2,
        };
        assert!(!p.allows(ServiceTier::Priority, 0));
        assert!(p.allows(ServiceTier::Flex, 1));
        assert!(!p.allows(ServiceTier::Flex, 2));
        assert!(!PreemptPolicy::OFF.allows(ServiceTier::Flex, 0));
    }

    #[tokio::test]
    async fn a_lever_pulled_before_anyone_waits_is_seen() {
        let l = Lever::default();
        l.pull();
        tokio::time::timeout(std::time::Duration::from_millis(100), l.pulled())
            .await
            .expect("already pulled");
    }
}
