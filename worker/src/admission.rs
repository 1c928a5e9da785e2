//! Bounded concurrency with a bounded queue.
//!
//! At most `max_concurrency` generations run at once; up to `max_queue` more
//! wait their turn in FIFO order (tokio's semaphore is fair). Beyond that a
//! request is refused at once with `OVERLOADED`, so the gateway can try
//! another worker instead of waiting here.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The admission gate shared by all requests of this worker.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    capacity: u32,
    max_queue: u32,
    queued: AtomicU32,
}

/// Held while a generation runs; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// The queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded {
    pub running: u32,
    pub queued: u32,
}

/// A place in the queue: counts as queued until dropped.
struct QueuedGuard<'a>(&'a AtomicU32);

impl Drop for QueuedGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub fn new(max_concurrency: u32, max_queue: u32) -> Self {
        let capacity = max_concurrency.max(1);
        Self {
            slots: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
            max_queue,
            queued: AtomicU32::new(0),
        }
    }

    /// Waits for a running slot, queueing if all are busy. Fails at once when
    /// the queue is full. Cancel-safe: dropping the future leaves the queue.
    pub async fn admit(&self) -> Result<Slot, Overloaded> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(Slot { _permit: permit });
        }
        let reserved = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < self.max_queue).then_some(q + 1)
            });
        if reserved.is_err() {
            return Err(Overloaded {
                running: self.running(),
                queued: self.queued(),
            });
        }
        let _queued = QueuedGuard(&self.queued);
        match Arc::clone(&self.slots).acquire_owned().await {
            Ok(permit) => Ok(Slot { _permit: permit }),
            // The semaphore is never closed; treat it as full if it were.
            Err(_) => Err(Overloaded {
                running: self.running(),
                queued: self.queued(),
            }),
        }
    }

    pub fn running(&self) -> u32 {
        self.capacity
            .saturating_sub(u32::try_from(self.slots.available_permits()).unwrap_or(u32::MAX))
    }

    pub fn queued(&self) -> u32 {
        self.queued.load(Ordering::Acquire)
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Nothing running or waiting (used to finish a drain early).
    pub fn is_idle(&self) -> bool {
        self.running() == 0 && self.queued() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn runs_up_to_capacity_queues_up_to_max_queue_then_refuses() {
        let adm = Arc::new(Admission::new(2, 1));
        let a = adm.admit().await.expect("first slot");
        let _b = adm.admit().await.expect("second slot");
        assert_eq!((adm.running(), adm.queued()), (2, 0));

        let waiter = {
            let adm = Arc::clone(&adm);
            tokio::spawn(async move { adm.admit().await.map(|_slot| ()) })
        };
        while adm.queued() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            adm.admit().await.err(),
            Some(Overloaded {
                running: 2,
                queued: 1
            })
        );

        drop(a);
        let admitted = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(admitted, Ok(Ok(Ok(())))));
        assert_eq!(adm.queued(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let adm = Admission::new(1, 4);
        let _a = adm.admit().await.expect("slot");
        let wait = tokio::time::timeout(Duration::from_millis(20), adm.admit()).await;
        assert!(wait.is_err(), "second request must wait");
        assert_eq!(adm.queued(), 0);
        assert!(!adm.is_idle());
    }
}
