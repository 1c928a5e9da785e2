//! The Responses store: stored response objects, their input items and the
//! conversation they continue, the event logs of runs, and run leases.
//!
//! One trait, two implementations that pass one test suite:
//! - [`redis::RedisStore`]: shared by every gateway replica. A response's
//!   keys share one hash tag (`resp:{id}`, `resp:{id}:events`) so they live
//!   in one Redis Cluster slot and Lua scripts can touch them atomically.
//! - [`memory::MemoryStore`]: in-process, for `gateway up` and single
//!   machines; same semantics, nothing survives a restart.
//!
//! Invariants both keep:
//! - Everything of a response expires after the storage window; after that
//!   it is gone (404), exactly like a deleted one.
//! - A response is visible only to the organisation that created it.
//! - With a cap (`NewResponse::max_stored_bytes`, the plan's
//!   `max_stored_bytes`), a create that would take the organisation's
//!   stored bytes past it is refused ([`StoreError::QuotaExceeded`]);
//!   a delete gives the bytes back, and so does expiry (the in-process
//!   store exactly; Redis when the usage bucket of the hour, or so, the
//!   response was stored in expires: see `redis.rs`). When its run ends
//!   (the terminal write, whoever makes it) a capped response is charged
//!   again at its full size: the final object with its output and the
//!   event log ([`charged_at_end`]). That charge is never refused (the run
//!   was admitted), so an organisation may end past its cap; its next
//!   stored create is then refused. An `Idempotency-Key`'s record counts
//!   too, for its window ([`ResponseStore::charge_record`]).
//! - The terminal status is written once: every write that can end a run is
//!   a compare-and-set against "not yet terminal", and the event log takes
//!   no event after the terminal one.

pub mod memory;
pub mod redis;

use crate::api::responses::EncodedEvent;
use crate::api::responses::{InputItem, ResponseObject, ResponseStatus};
use async_trait::async_trait;
use std::time::Duration;

/// Why the store could not do what was asked. The HTTP layer maps it to the
/// spec's envelope (`error/map.rs`); the store knows nothing of HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The backing store did not answer `op` (connect, read, write, ...):
    /// transient, worth a retry.
    Unavailable { op: &'static str },
    /// A stored value could not be decoded (`what` names it).
    Corrupt { what: &'static str },
    /// A value could not be encoded for storage.
    Encode,
    /// Storing this response (`needed` bytes) would take its organisation
    /// past its plan's cap on stored bytes; `used` are stored already.
    QuotaExceeded { used: u64, needed: u64, cap: u64 },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable { op } => write!(f, "the response store did not answer ({op})"),
            Self::Corrupt { what } => write!(f, "a stored response could not be read ({what})"),
            Self::Encode => f.write_str("a response could not be encoded for storage"),
            Self::QuotaExceeded { used, needed, cap } => write!(
                f,
                "storing {needed} bytes would take the organisation's {used} stored bytes past its cap of {cap}"
            ),
        }
    }
}

impl std::error::Error for StoreError {}

pub type StoreResult<T> = Result<T, StoreError>;

/// What to store when a response is created.
pub struct NewResponse<'a> {
    pub org: &'a str,
    pub object: &'a ResponseObject,
    /// This request's input items, with ids (listed by `input_items`).
    pub input_items: &'a [InputItem],
    /// The conversation before this request's output: the chain's items
    /// and this input. With the output appended it is what a follow-up
    /// request with `previous_response_id` continues.
    pub context: &'a [InputItem],
    /// Register a run lease until this Unix time in milliseconds.
    pub lease_until_ms: Option<u64>,
    /// The organisation's cap on stored bytes (its plan's); 0: none, and
    /// the response is not counted.
    pub max_stored_bytes: u64,
}

/// The bytes a new response puts in the store, as its cap counts them
/// when it is created: the encoded object, input items and conversation
/// (the bulk of it: the conversation repeats the chain's input). The
/// output and the event log are counted when the run ends
/// ([`charged_at_end`]).
pub fn stored_bytes(object: &str, input_items: &str, context: &str) -> u64 {
    (object.len() + input_items.len() + context.len()) as u64
}

/// [`stored_bytes`] of a new response, counted without encoding it.
pub fn stored_bytes_of(new: &NewResponse<'_>) -> u64 {
    input_bytes_of(new) + encoded_len(new.object)
}

/// The encoded bytes of a new response's input items and conversation.
pub fn input_bytes_of(new: &NewResponse<'_>) -> u64 {
    encoded_len(new.input_items) + encoded_len(new.context)
}

/// What an ended response counts against its organisation's cap: the
/// bytes its inputs were charged at creation (`inputs`: input items and
/// conversation), its final object and its event log, each entry's name
/// and payload (the Redis store counts the same in Lua).
pub fn charged_at_end(inputs: u64, object: &ResponseObject, events: &[EncodedEvent]) -> u64 {
    let log: u64 = events
        .iter()
        .map(|e| (e.name.len() + e.data.len()) as u64)
        .sum();
    inputs + encoded_len(object) + log
}

fn encoded_len<T: serde::Serialize + ?Sized>(v: &T) -> u64 {
    crate::api::encoded_len(v) as u64
}

/// What a run's owner learns when it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written; the run is still the owner's to finish.
    Written,
    /// Nothing written: the run already has a terminal status (it was
    /// cancelled, or the sweeper failed it). The owner must stop.
    AlreadyTerminal,
    /// Nothing written: the response was deleted or expired.
    Gone,
}

/// Who ends a run from outside its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndedBy {
    /// A client's cancel: final.
    Cancel,
    /// A sweeper, after the owner's lease lapsed: the owner may still be
    /// alive behind a partition, so its own final write of a foreground
    /// response may replace this one (see [`ResponseStore::finish`]).
    Sweeper,
}

/// A stored response with the conversation it ended, for chaining.
pub struct StoredConversation {
    pub object: ResponseObject,
    pub context: Vec<InputItem>,
}

#[async_trait]
pub trait ResponseStore: Send + Sync {
    /// Stores a new response (object, input items, context) with the
    /// storage window as its time to live.
    async fn create(&self, new: NewResponse<'_>) -> StoreResult<()>;

    /// The response object, if it exists for this organisation.
    async fn get(&self, org: &str, id: &str) -> StoreResult<Option<ResponseObject>>;

    /// The object regardless of organisation: for the sweeper, which ends
    /// abandoned runs of every organisation. Never answer a client with it.
    async fn object(&self, id: &str) -> StoreResult<Option<ResponseObject>>;

    /// The object and its conversation context (for `previous_response_id`).
    async fn conversation(&self, org: &str, id: &str) -> StoreResult<Option<StoredConversation>>;

    /// The request's input items, in order.
    async fn input_items(&self, org: &str, id: &str) -> StoreResult<Option<Vec<InputItem>>>;

    /// Deletes everything stored for the response. False if there was nothing.
    async fn delete(&self, org: &str, id: &str) -> StoreResult<bool>;

    /// The owner's write: appends `events` (sequence numbers assigned by the
    /// owner) and, when given, replaces the object and its status. A
    /// terminal `object` makes this the compare-and-set that ends the run.
    /// Writes nothing once the run is terminal or the response is gone.
    async fn write(
        &self,
        id: &str,
        object: Option<&ResponseObject>,
        events: &[EncodedEvent],
    ) -> StoreResult<WriteOutcome>;

    /// The owner's terminal write of a foreground response (no event log):
    /// sets `object` unless the run already ended, or unless it ended by
    /// anyone but a sweeper. A sweeper's `failed` is a guess that the owner
    /// died; the owner's own record (what its client was told) replaces it.
    /// Repeating a write that landed is success.
    async fn finish(&self, id: &str, object: &ResponseObject) -> StoreResult<WriteOutcome>;

    /// Ends a run from outside its owner (cancel, or the sweeper after a lost
    /// lease): sets the terminal `object` unless the run is already
    /// terminal. For a background response it first closes the event log
    /// to its owner (whose next write then finds the run ended), folds the
    /// log into `object.output`, so the object tells what the replay
    /// shows, and appends the terminal event with the next sequence number.
    async fn terminate(
        &self,
        id: &str,
        object: &mut ResponseObject,
        by: EndedBy,
    ) -> StoreResult<WriteOutcome>;

    /// Events with a sequence number above `after` (all when `None`), up to `limit`.
    async fn read_events(
        &self,
        id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<EncodedEvent>>;

    /// A follower of the event log from after `after`, for live streams.
    async fn follow(&self, id: &str, after: Option<u64>) -> StoreResult<Box<dyn EventFollower>>;

    /// The run's current status (`None` when gone). Owners poll this while
    /// the worker is quiet to notice a cancel from another replica.
    async fn status(&self, id: &str) -> StoreResult<Option<ResponseStatus>>;

    /// Sets (or extends) the leases of runs this replica owns.
    async fn renew_leases(&self, ids: &[String], until_ms: u64) -> StoreResult<()>;

    /// Drops a run's lease (its run ended).
    async fn release_lease(&self, id: &str) -> StoreResult<()>;

    /// Runs whose lease ended before `now_ms` (oldest first, up to `limit`).
    async fn expired_leases(&self, now_ms: u64, limit: usize) -> StoreResult<Vec<String>>;

    /// A draining owner hands its run over: `record` (what a peer needs to
    /// run it, `runs::handover`) is kept beside the run and the lease ends
    /// now, so a peer's sweeper adopts the run ([`Self::take_handover`])
    /// rather than failing it.
    async fn hand_over(&self, id: &str, record: &str) -> StoreResult<()>;

    /// A sweeper found run `id`'s lease expired: takes its hand-over record
    /// if there is one, marking it adopted until `until_ms` (exactly one
    /// sweeper takes it), and renews the run's lease until then for the
    /// adopter.
    async fn take_handover(
        &self,
        id: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> StoreResult<TakeHandover>;

    /// Whether other replicas share this store (and so may adopt a run).
    fn shared(&self) -> bool;

    /// Counts `bytes` of a record kept beside the responses for `keep` (an
    /// `Idempotency-Key`'s record) against `org`'s cap `cap`; refused like
    /// a create that would pass it ([`StoreError::QuotaExceeded`]). They
    /// count until `keep` has passed (on Redis: at most one bucket's
    /// stretch longer), and a stored create sees them.
    async fn charge_record(
        &self,
        org: &str,
        bytes: u64,
        cap: u64,
        keep: Duration,
    ) -> StoreResult<()>;
}

/// What a sweeper learns from [`ResponseStore::take_handover`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeHandover {
    /// This sweeper adopts the run: its hand-over record.
    Taken(String),
    /// Another sweeper adopted it a moment ago (its lease renewal may not
    /// have landed yet): leave it alone.
    Held,
    /// Not handed over (or its adopter died too): the owner is gone.
    NotHandedOver,
}

/// Reads an event log live: each call returns the next events, waiting up
/// to `wait` for some to arrive (an empty batch means none came).
#[async_trait]
pub trait EventFollower: Send {
    async fn next_batch(&mut self, wait: Duration) -> StoreResult<Vec<EncodedEvent>>;
}

/// The store to use: Redis through `redis` (the process's handle, made when
/// `redis_url` is set; it connects lazily, on first use), else the
/// in-process store. Everything stored expires after `window`.
pub fn open(
    redis: Option<std::sync::Arc<crate::redis::RedisHandle>>,
    window: Duration,
) -> std::sync::Arc<dyn ResponseStore> {
    match redis {
        Some(handle) => std::sync::Arc::new(redis::RedisStore::new(handle, window)),
        None => std::sync::Arc::new(memory::MemoryStore::new(window)),
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The shared test suite: every implementation must pass it.
#[cfg(test)]
pub mod suite {
    use super::*;
    use crate::api::event_log::fold_output;
    use crate::api::responses::external_terminal;
    use crate::api::responses::ItemContent;
    use std::collections::BTreeMap;

    pub fn object(id: &str, background: bool) -> ResponseObject {
        ResponseObject {
            id: id.into(),
            object: "response".into(),
            created_at: 1,
            status: if background {
                ResponseStatus::Queued
            } else {
                ResponseStatus::InProgress
            },
            background,
            error: None,
            incomplete_details: None,
            instructions: None,
            max_output_tokens: None,
            model: "base".into(),
            output: Vec::new(),
            parallel_tool_calls: true,
            previous_response_id: None,
            reasoning: Default::default(),
            store: true,
            temperature: None,
            text: serde_json::json!({"format":{"type":"text"}}),
            tool_choice: serde_json::json!("auto"),
            tools: Vec::new(),
            top_p: None,
            truncation: "disabled".into(),
            usage: None,
            metadata: BTreeMap::new(),
            service_tier: "default".into(),
            completed_at: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            top_logprobs: 0,
            max_tool_calls: None,
            safety_identifier: None,
            prompt_cache_key: None,
            user: None,
        }
    }

    fn item(id: &str, text: &str) -> InputItem {
        InputItem {
            kind: Some("message".into()),
            id: Some(id.into()),
            role: Some("user".into()),
            content: Some(ItemContent::Text(text.into())),
            ..Default::default()
        }
    }

    fn ev(seq: u64, name: &str) -> EncodedEvent {
        EncodedEvent {
            seq,
            name: name.into(),
            data: format!("{{\"type\":\"{name}\",\"sequence_number\":{seq}}}"),
        }
    }

    pub fn new_id() -> String {
        crate::ids::new_id("resp_test")
    }

    async fn create(store: &dyn ResponseStore, org: &str, obj: &ResponseObject) {
        create_capped(store, org, obj, 0).await.unwrap();
    }

    async fn create_capped(
        store: &dyn ResponseStore,
        org: &str,
        obj: &ResponseObject,
        max_stored_bytes: u64,
    ) -> StoreResult<()> {
        let items = [item("msg_a", "hello"), item("msg_b", "again")];
        store
            .create(NewResponse {
                org,
                object: obj,
                input_items: &items,
                context: &items,
                lease_until_ms: None,
                max_stored_bytes,
            })
            .await
    }

    /// The bytes one response of [`create`] counts.
    fn one_response(obj: &ResponseObject) -> u64 {
        let items = [item("msg_a", "hello"), item("msg_b", "again")];
        stored_bytes_of(&NewResponse {
            org: "",
            object: obj,
            input_items: &items,
            context: &items,
            lease_until_ms: None,
            max_stored_bytes: 0,
        })
    }

    /// Runs every case against `store`.
    pub async fn run(store: &dyn ResponseStore) {
        put_get_delete_and_org_scope(store).await;
        events_append_read_and_terminal_once(store).await;
        terminate_races_the_owner(store).await;
        the_owners_final_write_replaces_a_sweep(store).await;
        follow_sees_live_events(store).await;
        leases_expire(store).await;
        stored_bytes_are_capped_per_org(store).await;
        the_end_of_a_run_is_charged(store).await;
        a_handed_over_run_is_taken_once(store).await;
    }

    /// A hand-over ends the run's lease now; exactly one sweeper takes the
    /// record (the next finds it held while the taker's lease is young),
    /// and once that lease has lapsed too the run is simply lost.
    async fn a_handed_over_run_is_taken_once(store: &dyn ResponseStore) {
        let id = new_id();
        create(store, "o", &object(&id, true)).await;
        store
            .renew_leases(std::slice::from_ref(&id), now_ms() + 60_000)
            .await
            .unwrap();
        assert_eq!(
            store
                .take_handover(&id, now_ms(), now_ms() + 1000)
                .await
                .unwrap(),
            TakeHandover::NotHandedOver,
            "nothing was handed over"
        );
        store.hand_over(&id, "record").await.unwrap();
        let now = now_ms();
        assert!(
            store.expired_leases(now, 1000).await.unwrap().contains(&id),
            "the lease ended"
        );
        assert_eq!(
            store.take_handover(&id, now, now + 1000).await.unwrap(),
            TakeHandover::Taken("record".into())
        );
        assert!(
            !store.expired_leases(now, 1000).await.unwrap().contains(&id),
            "renewed for the adopter"
        );
        assert_eq!(
            store.take_handover(&id, now, now + 1000).await.unwrap(),
            TakeHandover::Held
        );
        assert_eq!(
            store
                .take_handover(&id, now + 2000, now + 3000)
                .await
                .unwrap(),
            TakeHandover::NotHandedOver,
            "the adopter's lease lapsed: lost"
        );
        store.release_lease(&id).await.unwrap();
    }

    /// Two responses fit the cap, a third does not; another organisation
    /// is not affected; a delete makes room again.
    async fn stored_bytes_are_capped_per_org(store: &dyn ResponseStore) {
        // Organisations of their own: the Redis suite shares one server.
        let (org, other) = (new_id(), new_id());
        let ids: Vec<String> = (0..3).map(|_| new_id()).collect();
        let size = one_response(&object(&ids[0], false));
        let cap = size * 2 + size / 2;
        for id in &ids[..2] {
            create_capped(store, &org, &object(id, false), cap)
                .await
                .unwrap();
        }
        let refused = create_capped(store, &org, &object(&ids[2], false), cap).await;
        assert_eq!(
            refused,
            Err(StoreError::QuotaExceeded {
                used: 2 * size,
                needed: size,
                cap
            })
        );
        assert_eq!(
            store.get(&org, &ids[2]).await.unwrap(),
            None,
            "nothing stored"
        );
        let elsewhere = new_id();
        create_capped(store, &other, &object(&elsewhere, false), cap)
            .await
            .unwrap();
        // Another org's delete gives nothing back; the owner's does.
        assert!(!store.delete(&other, &ids[0]).await.unwrap());
        assert!(create_capped(store, &org, &object(&ids[2], false), cap)
            .await
            .is_err());
        assert!(store.delete(&org, &ids[0]).await.unwrap());
        create_capped(store, &org, &object(&ids[2], false), cap)
            .await
            .unwrap();
        for id in &ids[1..] {
            store.delete(&org, id).await.unwrap();
        }
        store.delete(&other, &elsewhere).await.unwrap();
    }

    /// Issue 52, item 7: a capped response counts its output and its
    /// event log once its run ends, however it ends (the owner's final
    /// write of a background run or of a foreground one, a cancel). An
    /// admitted run may end past the cap; the next create is refused, and
    /// a delete gives back everything the response was charged.
    async fn the_end_of_a_run_is_charged(store: &dyn ResponseStore) {
        let org = new_id();
        let size = one_response(&object(&new_id(), false));
        let cap = size * 4;
        let output = "o".repeat(size as usize * 2);
        // A background run whose log outgrows the cap.
        let bg = new_id();
        let mut obj = object(&bg, true);
        create_capped(store, &org, &obj, cap).await.unwrap();
        obj.status = ResponseStatus::InProgress;
        let log: Vec<EncodedEvent> = (0..4)
            .map(|seq| EncodedEvent {
                seq,
                name: "response.output_text.delta".into(),
                data: output.clone(),
            })
            .collect();
        store.write(&bg, Some(&obj), &log).await.unwrap();
        // Running, it counts what it was created with: another fits.
        let fg = new_id();
        let mut foreground = object(&fg, false);
        create_capped(store, &org, &foreground, cap).await.unwrap();
        obj.status = ResponseStatus::Completed;
        let end = [ev(4, "response.completed")];
        assert_eq!(
            store.write(&bg, Some(&obj), &end).await.unwrap(),
            WriteOutcome::Written
        );
        let refused = create_capped(store, &org, &object(&new_id(), false), cap).await;
        let Err(StoreError::QuotaExceeded { used, .. }) = refused else {
            panic!("the ended run's log was not charged: {refused:?}");
        };
        assert!(used > cap, "{used} of {cap}");
        // A delete gives back all of it.
        assert!(store.delete(&org, &bg).await.unwrap());
        // A foreground run's final object with its output, by `finish`.
        foreground.status = ResponseStatus::Completed;
        foreground.metadata.insert("o".into(), output.repeat(2));
        store.finish(&fg, &foreground).await.unwrap();
        assert!(create_capped(store, &org, &object(&new_id(), false), cap)
            .await
            .is_err());
        assert!(store.delete(&org, &fg).await.unwrap());
        // A cancelled run counts its log too.
        let cancelled = new_id();
        let mut obj = object(&cancelled, true);
        create_capped(store, &org, &obj, cap).await.unwrap();
        obj.status = ResponseStatus::InProgress;
        store.write(&cancelled, Some(&obj), &log).await.unwrap();
        obj.status = ResponseStatus::Cancelled;
        store
            .terminate(&cancelled, &mut obj, EndedBy::Cancel)
            .await
            .unwrap();
        assert!(create_capped(store, &org, &object(&new_id(), false), cap)
            .await
            .is_err());
        assert!(store.delete(&org, &cancelled).await.unwrap());
        let last = new_id();
        create_capped(store, &org, &object(&last, false), cap)
            .await
            .unwrap();
        store.delete(&org, &last).await.unwrap();
    }

    async fn put_get_delete_and_org_scope(store: &dyn ResponseStore) {
        let id = new_id();
        let obj = object(&id, false);
        create(store, "org-a", &obj).await;
        assert_eq!(store.get("org-a", &id).await.unwrap(), Some(obj.clone()));
        assert_eq!(store.get("org-b", &id).await.unwrap(), None);
        assert_eq!(store.object(&id).await.unwrap(), Some(obj.clone()));
        let items = store.input_items("org-a", &id).await.unwrap().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].id.as_deref(), Some("msg_b"));
        assert!(store.input_items("org-b", &id).await.unwrap().is_none());
        let conv = store.conversation("org-a", &id).await.unwrap().unwrap();
        assert_eq!(conv.context.len(), 2);
        assert!(!store.delete("org-b", &id).await.unwrap());
        assert!(store.delete("org-a", &id).await.unwrap());
        assert!(!store.delete("org-a", &id).await.unwrap());
        assert_eq!(store.get("org-a", &id).await.unwrap(), None);
        assert_eq!(store.status(&id).await.unwrap(), None);
    }

    async fn events_append_read_and_terminal_once(store: &dyn ResponseStore) {
        let id = new_id();
        let mut obj = object(&id, true);
        create(store, "org-a", &obj).await;
        obj.status = ResponseStatus::InProgress;
        let first = [ev(0, "response.created"), ev(1, "response.in_progress")];
        assert_eq!(
            store.write(&id, Some(&obj), &first).await.unwrap(),
            WriteOutcome::Written
        );
        assert_eq!(
            store.status(&id).await.unwrap(),
            Some(ResponseStatus::InProgress)
        );
        let more = [
            ev(2, "response.output_text.delta"),
            ev(3, "response.output_text.delta"),
        ];
        assert_eq!(
            store.write(&id, None, &more).await.unwrap(),
            WriteOutcome::Written
        );
        // A retry of a write that landed (its reply was lost) is success
        // and appends nothing twice.
        assert_eq!(
            store.write(&id, None, &more).await.unwrap(),
            WriteOutcome::Written
        );
        let all = store.read_events(&id, None, 100).await.unwrap();
        assert_eq!(all.iter().map(|f| f.seq).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(all[0], first[0]);
        let after = store.read_events(&id, Some(1), 100).await.unwrap();
        assert_eq!(after.iter().map(|f| f.seq).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(store.read_events(&id, Some(0), 1).await.unwrap().len(), 1);

        obj.status = ResponseStatus::Completed;
        assert_eq!(
            store
                .write(&id, Some(&obj), &[ev(4, "response.completed")])
                .await
                .unwrap(),
            WriteOutcome::Written
        );
        // The owner's retry of its own terminal write is success too.
        assert_eq!(
            store
                .write(&id, Some(&obj), &[ev(4, "response.completed")])
                .await
                .unwrap(),
            WriteOutcome::Written
        );
        // Terminal once: neither the owner nor anyone else writes again.
        let mut late = obj.clone();
        late.status = ResponseStatus::Failed;
        assert_eq!(
            store
                .write(&id, Some(&late), &[ev(5, "response.failed")])
                .await
                .unwrap(),
            WriteOutcome::AlreadyTerminal
        );
        assert_eq!(
            store
                .terminate(&id, &mut late.clone(), EndedBy::Sweeper)
                .await
                .unwrap(),
            WriteOutcome::AlreadyTerminal
        );
        assert_eq!(store.read_events(&id, None, 100).await.unwrap().len(), 5);
        assert_eq!(
            store.get("org-a", &id).await.unwrap().unwrap().status,
            ResponseStatus::Completed
        );
        assert!(store.delete("org-a", &id).await.unwrap());
        assert!(store.read_events(&id, None, 100).await.unwrap().is_empty());
        assert_eq!(
            store.write(&id, None, &[ev(6, "x")]).await.unwrap(),
            WriteOutcome::Gone
        );
    }

    async fn terminate_races_the_owner(store: &dyn ResponseStore) {
        let id = new_id();
        let mut obj = object(&id, true);
        create(store, "org-a", &obj).await;
        obj.status = ResponseStatus::InProgress;
        store
            .write(
                &id,
                Some(&obj),
                &[ev(0, "response.created"), ev(1, "response.in_progress")],
            )
            .await
            .unwrap();
        // What the owner generated so far: an unfinished message.
        store
            .write(
                &id,
                None,
                &[
                    message_added(2, "msg_partial"),
                    text_delta(3, "msg_partial", "Once upon"),
                ],
            )
            .await
            .unwrap();
        let mut cancelled = obj.clone();
        cancelled.status = ResponseStatus::Cancelled;
        assert_eq!(
            store
                .terminate(&id, &mut cancelled, EndedBy::Cancel)
                .await
                .unwrap(),
            WriteOutcome::Written
        );
        // The object tells what the log tells.
        let stored = store.get("org-a", &id).await.unwrap().unwrap();
        assert_eq!(stored, cancelled);
        assert_eq!(
            serde_json::to_value(&stored.output).unwrap(),
            serde_json::json!([{"type": "message", "id": "msg_partial", "status": "incomplete",
                "role": "assistant", "content": [{"type": "output_text", "text": "Once upon",
                "annotations": [], "logprobs": []}]}])
        );
        // The owner's next write is refused and it must stop.
        assert_eq!(
            store
                .write(&id, None, &[text_delta(4, "msg_partial", " a time")])
                .await
                .unwrap(),
            WriteOutcome::AlreadyTerminal
        );
        let events = store.read_events(&id, None, 100).await.unwrap();
        assert_eq!(events.len(), 5);
        let last = &events[4];
        assert_eq!(last.seq, 4);
        assert_eq!(last, &external_terminal(&cancelled, 4));
        let v: serde_json::Value = serde_json::from_str(&last.data).unwrap();
        assert_eq!(v["sequence_number"], 4);
        assert_eq!(v["response"]["status"], "cancelled");
        assert_eq!(
            v["response"]["output"][0]["content"][0]["text"], "Once upon",
            "the terminal event carries the folded output"
        );
        assert!(store.status(&id).await.unwrap().unwrap().is_terminal());
        store.delete("org-a", &id).await.unwrap();
    }

    /// A foreground response swept as lost while its owner was cut off:
    /// the owner's final write replaces the sweeper's guess, but never a
    /// status that a client or the owner itself set.
    async fn the_owners_final_write_replaces_a_sweep(store: &dyn ResponseStore) {
        let id = new_id();
        let obj = object(&id, false);
        create(store, "org-a", &obj).await;
        let mut swept = obj.clone();
        swept.status = ResponseStatus::Failed;
        assert_eq!(
            store
                .terminate(&id, &mut swept, EndedBy::Sweeper)
                .await
                .unwrap(),
            WriteOutcome::Written
        );
        let mut completed = obj.clone();
        completed.status = ResponseStatus::Completed;
        completed.output = fold_output(&[
            message_added(0, "msg_done"),
            text_delta(1, "msg_done", "all of it"),
        ]);
        assert_eq!(
            store.finish(&id, &completed).await.unwrap(),
            WriteOutcome::Written
        );
        assert_eq!(
            store.get("org-a", &id).await.unwrap(),
            Some(completed.clone())
        );
        // A repeat of the write that landed is success; anything else after
        // the owner's record is refused.
        assert_eq!(
            store.finish(&id, &completed).await.unwrap(),
            WriteOutcome::Written
        );
        let mut other = completed.clone();
        other.status = ResponseStatus::Failed;
        assert_eq!(
            store.finish(&id, &other).await.unwrap(),
            WriteOutcome::AlreadyTerminal
        );
        assert_eq!(
            store
                .terminate(&id, &mut other.clone(), EndedBy::Sweeper)
                .await
                .unwrap(),
            WriteOutcome::AlreadyTerminal
        );
        assert_eq!(
            store.status(&id).await.unwrap(),
            Some(ResponseStatus::Completed)
        );
        // A run its owner has not finished takes the write as usual.
        let fresh = new_id();
        create(store, "org-a", &object(&fresh, false)).await;
        let mut done = object(&fresh, false);
        done.status = ResponseStatus::Completed;
        assert_eq!(
            store.finish(&fresh, &done).await.unwrap(),
            WriteOutcome::Written
        );
        assert_eq!(
            store.finish("resp_missing", &done).await.unwrap(),
            WriteOutcome::Gone
        );
        store.delete("org-a", &id).await.unwrap();
        store.delete("org-a", &fresh).await.unwrap();
    }

    fn message_added(seq: u64, item_id: &str) -> EncodedEvent {
        let data = serde_json::json!({"type": "response.output_item.added", "sequence_number": seq,
            "output_index": 0, "item": {"type": "message", "id": item_id, "status": "in_progress",
            "role": "assistant", "content": [{"type": "output_text", "text": "", "annotations": []}]}});
        EncodedEvent {
            seq,
            name: "response.output_item.added".into(),
            data: data.to_string(),
        }
    }

    fn text_delta(seq: u64, item_id: &str, delta: &str) -> EncodedEvent {
        let data = serde_json::json!({"type": "response.output_text.delta", "sequence_number": seq,
            "item_id": item_id, "output_index": 0, "content_index": 0, "delta": delta});
        EncodedEvent {
            seq,
            name: "response.output_text.delta".into(),
            data: data.to_string(),
        }
    }

    async fn follow_sees_live_events(store: &dyn ResponseStore) {
        let id = new_id();
        let obj = object(&id, true);
        create(store, "org-a", &obj).await;
        store
            .write(&id, None, &[ev(0, "response.created")])
            .await
            .unwrap();
        let mut follower = store.follow(&id, None).await.unwrap();
        let first = follower.next_batch(Duration::from_secs(2)).await.unwrap();
        assert_eq!(first.iter().map(|f| f.seq).collect::<Vec<_>>(), [0]);
        let empty = follower
            .next_batch(Duration::from_millis(100))
            .await
            .unwrap();
        assert!(empty.is_empty());
        let waiting = tokio::spawn(async move {
            let started = std::time::Instant::now();
            let batch = follower.next_batch(Duration::from_secs(3)).await.unwrap();
            (batch, started.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        store
            .write(&id, None, &[ev(1, "response.in_progress")])
            .await
            .unwrap();
        let (batch, waited) = waiting.await.unwrap();
        assert_eq!(batch.iter().map(|f| f.seq).collect::<Vec<_>>(), [1]);
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        // Resuming after N skips what was seen.
        let mut resumed = store.follow(&id, Some(0)).await.unwrap();
        let batch = resumed.next_batch(Duration::from_secs(1)).await.unwrap();
        assert_eq!(batch.iter().map(|f| f.seq).collect::<Vec<_>>(), [1]);
        store.delete("org-a", &id).await.unwrap();
    }

    /// For a store built with a window shorter than `wait`.
    pub async fn expires(store: &dyn ResponseStore, wait: Duration) {
        let id = new_id();
        let obj = object(&id, true);
        create(store, "org-a", &obj).await;
        store
            .write(&id, None, &[ev(0, "response.created")])
            .await
            .unwrap();
        assert!(store.get("org-a", &id).await.unwrap().is_some());
        tokio::time::sleep(wait).await;
        assert!(store.get("org-a", &id).await.unwrap().is_none());
        assert!(store.conversation("org-a", &id).await.unwrap().is_none());
        assert!(store.read_events(&id, None, 10).await.unwrap().is_empty());
    }

    async fn leases_expire(store: &dyn ResponseStore) {
        let (a, b) = (new_id(), new_id());
        let now = now_ms();
        store
            .renew_leases(&[a.clone(), b.clone()], now + 60_000)
            .await
            .unwrap();
        let expired = store.expired_leases(now + 1000, 100).await.unwrap();
        assert!(!expired.contains(&a) && !expired.contains(&b));
        store
            .renew_leases(std::slice::from_ref(&a), now - 10)
            .await
            .unwrap();
        let expired = store.expired_leases(now, 100).await.unwrap();
        assert!(expired.contains(&a) && !expired.contains(&b));
        store.release_lease(&a).await.unwrap();
        store.release_lease(&b).await.unwrap();
        assert!(!store
            .expired_leases(now + 120_000, 1000)
            .await
            .unwrap()
            .contains(&b));
    }
}
