//! The in-process store: one mutex-guarded map, with the same semantics as
//! the Redis store (time to live, organisation scope, terminal-once writes,
//! sequence-numbered event logs) and a watch channel per response so that
//! followers wake as soon as events arrive.

use super::{
    charged_at_end, input_bytes_of, stored_bytes_of, EndedBy, EventFollower, NewResponse,
    ResponseStore, StoreError, StoreResult, StoredConversation, TakeHandover, WriteOutcome,
};
use crate::api::event_log::fold_output;
use crate::api::responses::{external_terminal, EncodedEvent, ResponseStatus};
use crate::api::responses::{InputItem, ResponseObject};
use async_trait::async_trait;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

struct Entry {
    org: String,
    object: ResponseObject,
    input_items: Vec<InputItem>,
    context: Vec<InputItem>,
    events: Vec<EncodedEvent>,
    expires_at: Instant,
    /// The terminal status is a sweeper's: its owner's final write may
    /// replace it.
    swept: bool,
    /// Bytes counted against its organisation's cap (0: none was set):
    /// its inputs and first object, then, once its run ended, all of it.
    charged: u64,
    /// The encoded input items and conversation, counted in `charged`.
    inputs: u64,
    /// Bumped on every append; followers wait on it.
    appended: watch::Sender<usize>,
}

#[derive(Default)]
struct State {
    responses: HashMap<String, Entry>,
    leases: HashMap<String, u64>,
    /// Hand-over records of runs a draining owner let go (`hand_over`),
    /// with the time an adopter took them until.
    handovers: HashMap<String, Handover>,
    /// When expired responses were last dropped (see [`State::purge`]).
    purged: Option<Instant>,
    /// Other records charged to an organisation's cap
    /// ([`ResponseStore::charge_record`]): per org, (bytes, until), those
    /// ending within [`RECORDS_STRETCH`] of each other added up.
    records: HashMap<String, VecDeque<(u64, Instant)>>,
}

/// Charges of other records that end this close together are kept as one
/// (ending with the last), so their ledger stays small however many.
const RECORDS_STRETCH: Duration = Duration::from_secs(60);

struct Handover {
    record: String,
    adopted_until_ms: Option<u64>,
}

pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    window: Duration,
    /// Tests of the replicas' hand-over play a store other replicas share.
    shared: bool,
}

impl MemoryStore {
    /// `window`: how long a response is kept (the storage window).
    pub fn new(window: Duration) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            window,
            shared: false,
        }
    }

    /// The same store, answering as if other replicas shared it.
    #[cfg(test)]
    pub fn as_if_shared(mut self) -> Self {
        self.shared = true;
        self
    }
}

/// How often a create drops expired responses.
const PURGE_EVERY: Duration = Duration::from_secs(1);

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves plain data behind; keep serving.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    /// The live entry for `id`, dropping it when its time ran out.
    fn live(&mut self, id: &str) -> Option<&mut Entry> {
        if self
            .responses
            .get(id)
            .is_some_and(|e| e.expires_at <= Instant::now())
        {
            self.responses.remove(id);
        }
        self.responses.get_mut(id)
    }

    fn owned(&mut self, org: &str, id: &str) -> Option<&mut Entry> {
        self.live(id).filter(|e| e.org == org)
    }

    /// Drops every expired response, at most once per [`PURGE_EVERY`]:
    /// one nobody reads again would otherwise stay in memory for ever.
    fn purge(&mut self) {
        let now = Instant::now();
        if self.purged.is_some_and(|at| now < at + PURGE_EVERY) {
            return;
        }
        self.purged = Some(now);
        self.responses.retain(|_, e| e.expires_at > now);
        self.records.retain(|_, charges| {
            charges.retain(|(_, until)| *until > now);
            !charges.is_empty()
        });
    }

    /// The bytes `org`'s live responses count against its cap. A walk over
    /// every response, under the lock, so the check and the insert that
    /// follows are one step: this store serves one machine, whose stored
    /// responses are bounded by its memory.
    fn charged(&self, org: &str) -> u64 {
        let now = Instant::now();
        self.responses
            .values()
            .filter(|e| e.org == org && e.expires_at > now)
            .map(|e| e.charged)
            .sum::<u64>()
            + self.records_charged(org, now)
    }

    /// The bytes of `org`'s other live records ([`ResponseStore::charge_record`]).
    fn records_charged(&self, org: &str, now: Instant) -> u64 {
        self.records
            .get(org)
            .into_iter()
            .flatten()
            .filter(|(_, until)| *until > now)
            .map(|(bytes, _)| bytes)
            .sum()
    }
}

/// A capped response whose run just ended counts all it holds: the
/// final object and the event log (never refused: the run was admitted).
fn charge_end(entry: &mut Entry) {
    if entry.charged > 0 {
        let all = charged_at_end(entry.inputs, &entry.object, &entry.events);
        entry.charged = entry.charged.max(all);
    }
}

fn append(entry: &mut Entry, events: &[EncodedEvent]) {
    if events.is_empty() {
        return;
    }
    entry.events.extend_from_slice(events);
    let n = entry.events.len();
    entry.appended.send_replace(n);
}

#[async_trait]
impl ResponseStore for MemoryStore {
    async fn create(&self, new: NewResponse<'_>) -> StoreResult<()> {
        let (inputs, charged) = match new.max_stored_bytes {
            0 => (0, 0),
            _ => (input_bytes_of(&new), stored_bytes_of(&new)),
        };
        let mut state = lock(&self.state);
        state.purge();
        if new.max_stored_bytes > 0 {
            let used = state.charged(new.org);
            if used.saturating_add(charged) > new.max_stored_bytes {
                return Err(StoreError::QuotaExceeded {
                    used,
                    needed: charged,
                    cap: new.max_stored_bytes,
                });
            }
        }
        let (appended, _) = watch::channel(0);
        state.responses.insert(
            new.object.id.clone(),
            Entry {
                org: new.org.to_owned(),
                object: new.object.clone(),
                input_items: new.input_items.to_vec(),
                context: new.context.to_vec(),
                events: Vec::new(),
                expires_at: Instant::now() + self.window,
                swept: false,
                charged,
                inputs,
                appended,
            },
        );
        if let Some(until) = new.lease_until_ms {
            state.leases.insert(new.object.id.clone(), until);
        }
        Ok(())
    }

    async fn get(&self, org: &str, id: &str) -> StoreResult<Option<ResponseObject>> {
        Ok(lock(&self.state).owned(org, id).map(|e| e.object.clone()))
    }

    async fn object(&self, id: &str) -> StoreResult<Option<ResponseObject>> {
        Ok(lock(&self.state).live(id).map(|e| e.object.clone()))
    }

    async fn conversation(&self, org: &str, id: &str) -> StoreResult<Option<StoredConversation>> {
        Ok(lock(&self.state)
            .owned(org, id)
            .map(|e| StoredConversation {
                object: e.object.clone(),
                context: e.context.clone(),
            }))
    }

    async fn input_items(&self, org: &str, id: &str) -> StoreResult<Option<Vec<InputItem>>> {
        Ok(lock(&self.state)
            .owned(org, id)
            .map(|e| e.input_items.clone()))
    }

    async fn delete(&self, org: &str, id: &str) -> StoreResult<bool> {
        let mut state = lock(&self.state);
        if state.owned(org, id).is_none() {
            return Ok(false);
        }
        state.responses.remove(id);
        Ok(true)
    }

    async fn write(
        &self,
        id: &str,
        object: Option<&ResponseObject>,
        events: &[EncodedEvent],
    ) -> StoreResult<WriteOutcome> {
        let mut state = lock(&self.state);
        let Some(entry) = state.live(id) else {
            return Ok(WriteOutcome::Gone);
        };
        // A retried write that already landed is success (see the Redis
        // store's WRITE script).
        let landed = match events.last() {
            Some(last) => entry
                .events
                .binary_search_by_key(&last.seq, |f| f.seq)
                .is_ok_and(|i| entry.events[i] == *last),
            None => object.is_some_and(|o| *o == entry.object),
        };
        if landed {
            return Ok(WriteOutcome::Written);
        }
        if entry.object.is_terminal() {
            return Ok(WriteOutcome::AlreadyTerminal);
        }
        if let Some(o) = object {
            entry.object = o.clone();
        }
        append(entry, events);
        if entry.object.is_terminal() {
            charge_end(entry);
        }
        Ok(WriteOutcome::Written)
    }

    async fn finish(&self, id: &str, object: &ResponseObject) -> StoreResult<WriteOutcome> {
        let mut state = lock(&self.state);
        let Some(entry) = state.live(id) else {
            return Ok(WriteOutcome::Gone);
        };
        if entry.object == *object {
            return Ok(WriteOutcome::Written);
        }
        if entry.object.is_terminal() && !entry.swept {
            return Ok(WriteOutcome::AlreadyTerminal);
        }
        entry.object = object.clone();
        entry.swept = false;
        charge_end(entry);
        Ok(WriteOutcome::Written)
    }

    async fn terminate(
        &self,
        id: &str,
        object: &mut ResponseObject,
        by: EndedBy,
    ) -> StoreResult<WriteOutcome> {
        let mut state = lock(&self.state);
        let Some(entry) = state.live(id) else {
            return Ok(WriteOutcome::Gone);
        };
        if entry.object.is_terminal() {
            return Ok(WriteOutcome::AlreadyTerminal);
        }
        if object.background {
            // Under the lock the log cannot grow before the terminal event.
            object.output = fold_output(&entry.events);
        }
        entry.object = object.clone();
        entry.swept = by == EndedBy::Sweeper;
        if object.background {
            let seq = entry.events.last().map_or(0, |f| f.seq + 1);
            append(entry, &[external_terminal(object, seq)]);
        }
        charge_end(entry);
        Ok(WriteOutcome::Written)
    }

    async fn read_events(
        &self,
        id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<EncodedEvent>> {
        let mut state = lock(&self.state);
        Ok(state
            .live(id)
            .map(|e| events_after(&e.events, after, limit))
            .unwrap_or_default())
    }

    async fn follow(&self, id: &str, after: Option<u64>) -> StoreResult<Box<dyn EventFollower>> {
        let mut state = lock(&self.state);
        let appended = state.live(id).map(|e| e.appended.subscribe());
        Ok(Box::new(MemoryFollower {
            state: self.state.clone(),
            id: id.to_owned(),
            after,
            appended,
        }))
    }

    async fn status(&self, id: &str) -> StoreResult<Option<ResponseStatus>> {
        Ok(lock(&self.state).live(id).map(|e| e.object.status))
    }

    async fn renew_leases(&self, ids: &[String], until_ms: u64) -> StoreResult<()> {
        let mut state = lock(&self.state);
        for id in ids {
            state.leases.insert(id.clone(), until_ms);
        }
        Ok(())
    }

    async fn release_lease(&self, id: &str) -> StoreResult<()> {
        lock(&self.state).leases.remove(id);
        Ok(())
    }

    async fn hand_over(&self, id: &str, record: &str) -> StoreResult<()> {
        let mut state = lock(&self.state);
        state.handovers.insert(
            id.to_owned(),
            Handover {
                record: record.to_owned(),
                adopted_until_ms: None,
            },
        );
        state.leases.insert(id.to_owned(), 0);
        Ok(())
    }

    async fn take_handover(
        &self,
        id: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> StoreResult<TakeHandover> {
        let mut state = lock(&self.state);
        let Some(handover) = state.handovers.get_mut(id) else {
            return Ok(TakeHandover::NotHandedOver);
        };
        match handover.adopted_until_ms {
            Some(until) if until > now_ms => return Ok(TakeHandover::Held),
            // Its adopter stopped renewing too: the run is lost.
            Some(_) => return Ok(TakeHandover::NotHandedOver),
            None => handover.adopted_until_ms = Some(until_ms),
        }
        let record = handover.record.clone();
        state.leases.insert(id.to_owned(), until_ms);
        Ok(TakeHandover::Taken(record))
    }

    async fn charge_record(
        &self,
        org: &str,
        bytes: u64,
        cap: u64,
        keep: Duration,
    ) -> StoreResult<()> {
        let mut state = lock(&self.state);
        state.purge();
        let used = state.charged(org);
        if used.saturating_add(bytes) > cap {
            return Err(StoreError::QuotaExceeded {
                used,
                needed: bytes,
                cap,
            });
        }
        let until = Instant::now() + keep;
        let charges = state.records.entry(org.to_owned()).or_default();
        match charges.back_mut() {
            Some(last) if until <= last.1 + RECORDS_STRETCH => {
                *last = (last.0 + bytes, last.1.max(until));
            }
            _ => charges.push_back((bytes, until)),
        }
        Ok(())
    }

    /// In process: no other replica could adopt a run.
    fn shared(&self) -> bool {
        self.shared
    }

    async fn expired_leases(&self, now_ms: u64, limit: usize) -> StoreResult<Vec<String>> {
        let state = lock(&self.state);
        let mut expired: Vec<(u64, &String)> = state
            .leases
            .iter()
            .filter(|(_, until)| **until < now_ms)
            .map(|(id, until)| (*until, id))
            .collect();
        expired.sort();
        Ok(expired
            .into_iter()
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect())
    }
}

fn events_after(events: &[EncodedEvent], after: Option<u64>, limit: usize) -> Vec<EncodedEvent> {
    let start = after.map_or(0, |a| events.partition_point(|f| f.seq <= a));
    events[start..].iter().take(limit).cloned().collect()
}

struct MemoryFollower {
    state: Arc<Mutex<State>>,
    id: String,
    after: Option<u64>,
    /// `None` when the response did not exist at subscription time.
    appended: Option<watch::Receiver<usize>>,
}

#[async_trait]
impl EventFollower for MemoryFollower {
    async fn next_batch(&mut self, wait: Duration) -> StoreResult<Vec<EncodedEvent>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(rx) = &mut self.appended {
                rx.borrow_and_update();
            }
            let batch = {
                let mut state = lock(&self.state);
                state
                    .live(&self.id)
                    .map(|e| events_after(&e.events, self.after, 1000))
                    .unwrap_or_default()
            };
            if let Some(last) = batch.last() {
                self.after = Some(last.seq);
                return Ok(batch);
            }
            let Some(rx) = &mut self.appended else {
                return Ok(Vec::new());
            };
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                // The entry was dropped (deleted) or the wait ran out.
                Ok(Err(_)) | Err(_) => return Ok(Vec::new()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_store_suite() {
        let store = MemoryStore::new(Duration::from_secs(60));
        super::super::suite::run(&store).await;
    }

    #[tokio::test]
    async fn responses_expire_after_the_window() {
        let store = MemoryStore::new(Duration::from_millis(300));
        super::super::suite::expires(&store, Duration::from_millis(400)).await;
    }
}
