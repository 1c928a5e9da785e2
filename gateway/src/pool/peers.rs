//! One pool's order across gateway replicas (with Redis: `[store]
//! redis_url`). Each replica publishes, per pool, the ranks of its best
//! waiting requests and the slots it holds, in one Redis hash whose fields
//! (one per replica) lapse unless renewed, so a dead replica's vanish
//! within [`ENTRY_TTL`]. The organisations' virtual counters live in a
//! second hash, so organisations seen by different replicas are compared
//! on one scale.
//!
//! The queue never waits for Redis: it decides from the last view it got
//! ([`PeerView`]), and a task per pool ([`sync`]) refreshes that view in
//! one script call (`sync.lua`) whenever the queue's state changes, when a
//! peer nudges (Redis pub/sub) and on a heartbeat. A replica with a free
//! slot grants its own best waiter only if no peer has a strictly better
//! one ([`PeerView::better_than`]); else it leaves the slot and nudges, and
//! the peer dispatches at once. Without a fresh view (Redis slow or gone)
//! the queue orders what it sees, as a single replica does.

use crate::accounts::ServiceTier;
use crate::redis::RedisHandle;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How often a replica renews its entry (and reads its peers') when
/// nothing changes.
const HEARTBEAT: Duration = Duration::from_millis(500);
/// A replica's entry lapses this long after its last renewal.
pub const ENTRY_TTL: Duration = Duration::from_millis(2000);
/// A view older than this is not trusted: the queue orders locally.
pub const VIEW_FRESH_FOR: Duration = Duration::from_millis(1500);
/// A replica with peers grants a slot on a view at most this old (else it
/// syncs first, one round trip): a peer's grants since would not be in an
/// older one, and a peer that takes a slot it saw free does not nudge. At
/// 50 ms a replica granted on a view that missed a peer's grant into the
/// same freed slot, and its request waited in the worker's own queue
/// (where nothing preempts for it) for a generation to end: a 0.4 s tail
/// on two replicas. A sync takes about a millisecond.
const GRANT_ON_VIEW_FOR: Duration = Duration::from_millis(3);
/// A sync that takes longer is abandoned (the queue keeps its last view).
const SYNC_TIMEOUT: Duration = Duration::from_millis(500);
/// Ranks published per replica: enough for the slots one dispatch fills.
const PUBLISHED_RANKS: usize = 16;
/// Organisations whose shared counters one sync reads back.
pub const MAX_READ_ORGS: usize = 256;
/// The shared counters lapse when no replica has had an active
/// organisation for this long (nobody active: they start over).
const COUNTERS_TTL: Duration = Duration::from_secs(10);

/// A waiting request's place in the pool's order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rank {
    pub tier: ServiceTier,
    /// A generation that already started goes first in its tier.
    pub started: bool,
    /// Its organisation's virtual counter (shared scale).
    pub counter: f64,
}

impl Rank {
    /// Whether `self` is served strictly before `other`: higher tier, then
    /// a started generation, then the lower counter.
    pub fn before(&self, other: &Rank) -> bool {
        self.cmp_order(other) == Ordering::Less
    }

    fn cmp_order(&self, other: &Rank) -> Ordering {
        other
            .tier
            .cmp(&self.tier)
            .then_with(|| other.started.cmp(&self.started))
            .then_with(|| self.counter.total_cmp(&other.counter))
    }

    fn encode(&self) -> String {
        format!(
            "{}{}:{}",
            self.tier as u8,
            u8::from(self.started),
            self.counter
        )
    }

    fn decode(s: &str) -> Option<Rank> {
        let (head, counter) = s.split_once(':')?;
        let mut chars = head.chars();
        let tier = match chars.next()? {
            '0' => ServiceTier::Flex,
            '1' => ServiceTier::Default,
            '2' => ServiceTier::Priority,
            _ => return None,
        };
        let started = chars.next()? == '1';
        Some(Rank {
            tier,
            started,
            counter: counter.parse().ok()?,
        })
    }
}

/// What one replica publishes of one pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Entry {
    /// Worker slots it holds or has promised (in flight plus granted).
    pub in_use: u32,
    /// Its calls in flight per worker (address): a peer routes around
    /// the workers it fills.
    pub calls: Vec<(String, u32)>,
    /// Its running generations it may preempt (or has, their slots not
    /// yet free): its own waiters of a higher tier are served by these
    /// before a peer preempts for them.
    pub levers: u32,
    /// The lowest counter of its active organisations: where an
    /// organisation that becomes active elsewhere starts.
    pub floor: Option<f64>,
    /// Its best waiting requests' ranks, best first.
    pub ranks: Vec<Rank>,
}

impl Entry {
    pub fn encode(&self) -> String {
        let floor = self.floor.map_or_else(|| "-".to_owned(), |f| f.to_string());
        let ranks: Vec<String> = self.ranks.iter().map(Rank::encode).collect();
        let calls: Vec<String> = self.calls.iter().map(|(a, n)| format!("{a}={n}")).collect();
        format!(
            "{}|{}|{floor}|{}|{}",
            self.in_use,
            self.levers,
            calls.join(","),
            ranks.join(";")
        )
    }

    pub fn decode(s: &str) -> Option<Entry> {
        let mut parts = s.splitn(5, '|');
        let in_use = parts.next()?.parse().ok()?;
        let levers = parts.next()?.parse().ok()?;
        let floor = match parts.next()? {
            "-" => None,
            f => Some(f.parse().ok()?),
        };
        let calls = parts
            .next()?
            .split(',')
            .filter(|c| !c.is_empty())
            .map(|c| {
                let (addr, n) = c.rsplit_once('=')?;
                Some((addr.to_owned(), n.parse().ok()?))
            })
            .collect::<Option<Vec<(String, u32)>>>()?;
        let ranks = parts
            .next()?
            .split(';')
            .filter(|r| !r.is_empty())
            .map(Rank::decode)
            .collect::<Option<Vec<Rank>>>()?;
        Some(Entry {
            in_use,
            calls,
            levers,
            floor,
            ranks,
        })
    }
}

/// The live peers' entries, as last read.
#[derive(Debug, Default)]
pub struct PeerView {
    /// Every live peer's ranks, merged, best first.
    ranks: Vec<Rank>,
    /// Slots the live peers hold.
    in_use: u32,
    /// Their calls in flight, per worker, and in all.
    calls: HashMap<String, u32>,
    calls_total: u32,
    /// The peers' waiters their own levers do not serve, best first, with
    /// the peer each waits on.
    unserved: Vec<Rank>,
    /// Replicas holding levers ordered by id before this one: its place
    /// among the helpers ([`Self::unserved_tiers`]).
    helpers_before: usize,
    /// Peers holding levers.
    helpers: usize,
    /// Any live peer at all.
    has_peers: bool,
    /// The lowest floor of the live peers.
    floor: Option<f64>,
    read_at: Option<Instant>,
}

impl PeerView {
    /// This replica's (`me`) view of its peers' entries (by replica id)
    /// read at `read_at`.
    pub fn from_entries(
        me: &str,
        entries: impl IntoIterator<Item = (String, Entry)>,
        read_at: Instant,
    ) -> Self {
        let mut view = PeerView {
            read_at: Some(read_at),
            ..PeerView::default()
        };
        for (id, e) in entries {
            view.has_peers = true;
            view.in_use = view.in_use.saturating_add(e.in_use);
            for (addr, n) in &e.calls {
                *view.calls.entry(addr.clone()).or_default() += n;
                view.calls_total = view.calls_total.saturating_add(*n);
            }
            if e.levers > 0 {
                view.helpers += 1;
                view.helpers_before += usize::from(id.as_str() < me);
            }
            let own = e.levers as usize;
            view.unserved.extend(e.ranks.iter().skip(own).copied());
            view.floor = match (view.floor, e.floor) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            view.ranks.extend(e.ranks);
        }
        view.ranks.sort_by(Rank::cmp_order);
        view.unserved.sort_by(Rank::cmp_order);
        view
    }

    /// Whether the view is recent enough to act on.
    pub fn is_fresh(&self, now: Instant) -> bool {
        self.read_at
            .is_some_and(|t| now.saturating_duration_since(t) < VIEW_FRESH_FOR)
    }

    /// Whether a slot may be granted on this view: it is recent, or it
    /// showed no peer, or it is past trusting (the replica orders alone).
    pub fn current_for_grants(&self, now: Instant) -> bool {
        let Some(read_at) = self.read_at else {
            return true;
        };
        !self.has_peers
            || !self.is_fresh(now)
            || now.saturating_duration_since(read_at) < GRANT_ON_VIEW_FOR
    }

    /// Slots the peers hold (0 when the view is stale).
    pub fn in_use(&self, now: Instant) -> u32 {
        if self.is_fresh(now) {
            self.in_use
        } else {
            0
        }
    }

    /// Slots the peers promised to requests not yet on a worker (0 when
    /// the view is stale): their calls are counted per worker instead.
    pub fn promised(&self, now: Instant) -> u32 {
        self.in_use(now).saturating_sub(self.calls_total)
    }

    /// The peers' calls in flight on the worker at `addr`.
    pub fn calls_on(&self, addr: &str) -> u32 {
        self.calls.get(addr).copied().unwrap_or(0)
    }

    pub fn floor(&self, now: Instant) -> Option<f64> {
        self.floor.filter(|_| self.is_fresh(now))
    }

    /// How many of the peers' waiting requests go before `mine`: the slots
    /// this replica leaves them before granting `mine` one.
    pub fn better_than(&self, mine: &Rank, now: Instant) -> usize {
        if !self.is_fresh(now) {
            return 0;
        }
        self.ranks.iter().take_while(|p| p.before(mine)).count()
    }

    /// Whether any peer has a request waiting.
    pub fn anyone_waits(&self, now: Instant) -> bool {
        self.is_fresh(now) && !self.ranks.is_empty()
    }

    /// Whether a peer runs work it may preempt: a waiter here of a higher
    /// tier is worth telling it about at once.
    pub fn anyone_preemptible(&self, now: Instant) -> bool {
        self.is_fresh(now) && self.helpers > 0
    }

    /// Whether a peer acts at once on this replica's new `entry`: it has
    /// waiters (a slot may be its) or, for a waiter here, levers to pull.
    pub fn acts_on(&self, entry: &Entry, now: Instant) -> bool {
        self.anyone_waits(now) || (self.anyone_preemptible(now) && !entry.ranks.is_empty())
    }

    /// The tiers (best first) of the peers' waiting requests this replica
    /// (`me`, holding levers or not) preempts for: those their own
    /// replica's levers do not serve (a replica serves its own waiters
    /// first), shared out in turn among the replicas that hold levers,
    /// ordered by id, so that two helpers do not preempt for one waiter.
    /// The slot so freed is left to the peer ([`Self::better_than`]).
    /// Nothing when the view is stale.
    pub fn unserved_tiers(&self, my_levers: bool, now: Instant) -> Vec<ServiceTier> {
        if !my_levers || !self.is_fresh(now) {
            return Vec::new();
        }
        self.unserved
            .iter()
            .skip(self.helpers_before)
            .step_by(self.helpers + 1)
            .map(|r| r.tier)
            .collect()
    }
}

/// Per pool: what the queue tells its sync task, and what Redis has.
#[derive(Default)]
pub struct Link {
    /// The queue's state changed (a waiter in or out, a grant, a slot
    /// freed, a charge): publish it.
    pub changed: Notify,
    /// A peer published a change this replica may act on.
    pub nudged: Notify,
    /// The queue left a free slot to a peer: tell it now.
    pub deferred: AtomicBool,
}

/// What the queue hands one sync: its entry, the counters to add and the
/// organisations whose counters it orders by.
pub struct Outgoing {
    pub entry: Entry,
    /// (organisation, increment, floor): the counter becomes
    /// max(counter, floor) + increment; read back.
    pub counters: Vec<(Arc<str>, f64, f64)>,
    /// Whether this replica has an active organisation (keeps the shared
    /// counters alive).
    pub active: bool,
    /// Tell the peers (pub/sub) to look now.
    pub nudge: bool,
    /// The entry differs from the one last published.
    pub changed: bool,
}

/// What one sync read: the live peers' entries and the counters asked for.
pub struct Incoming {
    /// This replica's id.
    pub me: Arc<str>,
    /// (replica id, entry) of each live peer.
    pub peers: Vec<(String, Entry)>,
    pub counters: HashMap<Arc<str>, f64>,
}

/// One pool's keys and script on the shared Redis.
pub struct Shared {
    redis: Arc<RedisHandle>,
    /// This replica's field in the state hash.
    replica: Arc<str>,
    state_key: String,
    counters_key: String,
    channel: String,
    script: redis::Script,
}

impl Shared {
    pub fn new(redis: Arc<RedisHandle>, model: &str, replica: &str) -> Self {
        Self {
            state_key: redis.key("poolq", model, ""),
            counters_key: redis.key("poolq", model, ":vtc"),
            channel: nudge_channel(&redis, model),
            redis,
            replica: Arc::from(replica),
            script: redis::Script::new(include_str!("sync.lua")),
        }
    }

    /// Tells the peers to look now, outside a sync.
    async fn nudge(&self) -> redis::RedisResult<()> {
        let mut conn = self.redis.conn().await?;
        redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(&*self.replica)
            .query_async(&mut conn)
            .await
    }

    async fn exchange(&self, out: &Outgoing) -> redis::RedisResult<Incoming> {
        let mut conn = self.redis.conn().await?;
        let mut inv = self.script.key(&self.state_key);
        inv.key(&self.counters_key)
            .arg(&*self.replica)
            .arg(ENTRY_TTL.as_millis() as u64)
            .arg(out.entry.encode())
            .arg(if out.nudge { self.channel.as_str() } else { "" })
            .arg(if out.active {
                COUNTERS_TTL.as_millis() as u64
            } else {
                0
            });
        for (org, incr, floor) in &out.counters {
            inv.arg(&**org).arg(incr.to_string()).arg(floor.to_string());
        }
        let (peers, counters): (Vec<String>, Vec<String>) = inv.invoke_async(&mut conn).await?;
        // (id, entry) pairs, flat.
        let peers = peers
            .chunks_exact(2)
            .filter_map(|pair| Some((pair[0].clone(), Entry::decode(&pair[1])?)))
            .collect::<Vec<_>>();
        let counters = out
            .counters
            .iter()
            .zip(counters)
            .filter_map(|((org, _, _), v)| Some((Arc::clone(org), v.parse().ok()?)))
            .collect();
        Ok(Incoming {
            me: Arc::clone(&self.replica),
            peers,
            counters,
        })
    }
}

/// What the sync task needs of a pool's queue (`queue::PoolQueue`).
pub trait SharedOrder: Send + Sync {
    fn model(&self) -> &str;
    /// What to publish now (takes the counter changes not yet sent).
    fn outgoing(&self, link: &Link) -> Outgoing;
    /// What a sync read; true when the peers should be nudged now (the
    /// view just read shows one that acts on this replica's change).
    fn incoming(&self, out: Outgoing, incoming: Incoming, now: Instant) -> bool;
    /// A sync failed: keep its counter changes for the next.
    fn unsent(&self, out: Outgoing);
    /// Hands out turns with the view just read.
    fn dispatch(&self);
}

/// The pub/sub channel a pool's replicas nudge each other on.
pub fn nudge_channel(redis: &RedisHandle, model: &str) -> String {
    redis.key("poolq", model, ":nudge")
}

/// Keeps `queue`'s view of its peers fresh until the process ends: one
/// script call per change of the queue's state (coalesced), per nudge from
/// a peer, and per heartbeat; then dispatches with what it read.
pub async fn sync<Q: SharedOrder>(queue: Arc<Q>, shared: Shared, link: Arc<Link>) {
    let mut beat = tokio::time::interval(HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tokio::select! {
            _ = link.changed.notified() => {}
            _ = link.nudged.notified() => {}
            _ = beat.tick() => {}
        }
        let out = queue.outgoing(&link);
        let result = tokio::time::timeout(SYNC_TIMEOUT, shared.exchange(&out)).await;
        match result {
            Ok(Ok(incoming)) => {
                if warned {
                    tracing::info!(model = %queue.model(), "pool order shared across replicas again");
                    warned = false;
                }
                if queue.incoming(out, incoming, Instant::now()) {
                    let nudged = tokio::time::timeout(SYNC_TIMEOUT, shared.nudge()).await;
                    if !matches!(nudged, Ok(Ok(()))) {
                        crate::metrics::redis_error("pool_queue", "nudge");
                    }
                }
            }
            failed => {
                crate::metrics::redis_error("pool_queue", "sync");
                queue.unsent(out);
                if !warned {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_owned(),
                    };
                    tracing::warn!(model = %queue.model(), "cannot share the pool's order with the other replicas ({why}); ordering this replica's requests alone until Redis answers");
                    warned = true;
                }
            }
        }
        queue.dispatch();
    }
}

/// Listens for the peers' nudges on every pool's channel until the process
/// ends (resubscribing after a lost connection); `replica` is this one's
/// id, whose own nudges it ignores.
pub async fn listen(redis: Arc<RedisHandle>, replica: String, links: HashMap<String, Arc<Link>>) {
    use futures::StreamExt;
    loop {
        match subscribe(&redis, links.keys()).await {
            Ok(mut pubsub) => {
                // Missed nudges while away: look now.
                for link in links.values() {
                    link.nudged.notify_one();
                }
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let from: String = msg.get_payload().unwrap_or_default();
                    if from == replica {
                        continue;
                    }
                    if let Some(link) = links.get(msg.get_channel_name()) {
                        link.nudged.notify_one();
                    }
                }
            }
            Err(e) => {
                crate::metrics::redis_error("pool_queue", "subscribe");
                tracing::debug!("cannot subscribe to the pools' nudges: {e}");
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn subscribe(
    redis: &RedisHandle,
    channels: impl Iterator<Item = &String>,
) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = redis.pubsub().await?;
    for c in channels {
        pubsub.subscribe(c).await?;
    }
    Ok(pubsub)
}

/// The ranks a replica publishes: its waiters' best first, at most
/// [`PUBLISHED_RANKS`].
pub fn best_ranks(mut ranks: Vec<Rank>) -> Vec<Rank> {
    ranks.sort_by(Rank::cmp_order);
    ranks.truncate(PUBLISHED_RANKS);
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(tier: ServiceTier, started: bool, counter: f64) -> Rank {
        Rank {
            tier,
            started,
            counter,
        }
    }

    #[test]
    fn a_higher_tier_then_a_started_generation_then_the_lower_counter_goes_first() {
        let prio = rank(ServiceTier::Priority, false, 900.0);
        let default = rank(ServiceTier::Default, false, 0.0);
        let resumed = rank(ServiceTier::Default, true, 500.0);
        assert!(prio.before(&default) && !default.before(&prio));
        assert!(resumed.before(&default));
        assert!(rank(ServiceTier::Flex, false, 1.0).before(&rank(ServiceTier::Flex, false, 2.0)));
        // Equal ranks: neither goes strictly first (each replica serves its own).
        assert!(!default.before(&default));
    }

    #[test]
    fn a_free_slot_is_left_to_each_better_peer_waiter_only_while_the_view_is_fresh() {
        let now = Instant::now();
        let peer = Entry {
            in_use: 1,
            calls: Vec::new(),
            levers: 0,
            floor: Some(10.0),
            ranks: vec![
                rank(ServiceTier::Priority, false, 50.0),
                rank(ServiceTier::Default, false, 5.0),
            ],
        };
        let other = Entry {
            in_use: 2,
            calls: Vec::new(),
            levers: 0,
            floor: Some(4.0),
            ranks: vec![rank(ServiceTier::Default, false, 20.0)],
        };
        let view = PeerView::from_entries("a", [("p".into(), peer), ("q".into(), other)], now);
        assert_eq!(view.in_use(now), 3);
        assert_eq!(view.floor(now), Some(4.0));
        // A default request of counter 10: the priority one and the default
        // of counter 5 go first; the one of counter 20 does not.
        assert_eq!(
            view.better_than(&rank(ServiceTier::Default, false, 10.0), now),
            2
        );
        assert_eq!(
            view.better_than(&rank(ServiceTier::Priority, false, 0.0), now),
            0
        );
        assert_eq!(
            view.better_than(&rank(ServiceTier::Flex, true, 0.0), now),
            3
        );
        // A stale view (Redis silent): the replica orders alone.
        let later = now + VIEW_FRESH_FOR;
        assert_eq!(
            view.better_than(&rank(ServiceTier::Flex, true, 0.0), later),
            0
        );
        assert_eq!(view.in_use(later), 0);
        assert!(!PeerView::default().is_fresh(now));
        // Granted on only while recent, or once past trusting; a view
        // without peers always.
        assert!(view.current_for_grants(now));
        assert!(!view.current_for_grants(now + GRANT_ON_VIEW_FOR));
        assert!(view.current_for_grants(later));
        let alone = PeerView::from_entries("a", [], now);
        assert!(alone.current_for_grants(now + GRANT_ON_VIEW_FOR));
        assert!(PeerView::default().current_for_grants(now));
    }

    #[test]
    fn entries_read_back_as_written() {
        let e = Entry {
            in_use: 7,
            calls: vec![("http://10.0.0.7:9000".into(), 4), ("w2:50051".into(), 2)],
            levers: 3,
            floor: Some(12.5),
            ranks: vec![
                rank(ServiceTier::Priority, true, 0.0),
                rank(ServiceTier::Flex, false, 1e15),
            ],
        };
        assert_eq!(Entry::decode(&e.encode()), Some(e));
        let empty = Entry::default();
        assert_eq!(Entry::decode(&empty.encode()), Some(empty));
        assert_eq!(Entry::decode("x|0|-||"), None);
        assert_eq!(Entry::decode("1|-|"), None, "an entry without its levers");
        assert_eq!(
            Entry::decode("1|0|-|w1|"),
            None,
            "a worker without its count"
        );
    }

    #[test]
    fn peers_waiters_their_own_levers_serve_are_not_this_replica_s_to_preempt_for() {
        let now = Instant::now();
        let entry = |levers, tiers: &[ServiceTier]| Entry {
            in_use: 2,
            calls: Vec::new(),
            levers,
            floor: None,
            ranks: tiers.iter().map(|t| rank(*t, false, 0.0)).collect(),
        };
        let (prio, default) = (ServiceTier::Priority, ServiceTier::Default);
        // A peer waits with a priority and a default request and holds one
        // lever: the default one is this replica's to preempt for, if it
        // holds a lever itself.
        let view = PeerView::from_entries("a", [("b".into(), entry(1, &[prio, default]))], now);
        assert_eq!(view.unserved_tiers(true, now), vec![default]);
        assert!(view.unserved_tiers(false, now).is_empty());
        assert!(view.anyone_preemptible(now));
        // Two replicas with levers ("a", "c") help "b", which has none: its
        // three waiters alternate between them, best first.
        let view = |me: &str| {
            let mut peers = vec![("b".to_owned(), entry(0, &[prio, default, prio]))];
            let other = if me == "a" { "c" } else { "a" };
            peers.push((other.to_owned(), entry(2, &[])));
            PeerView::from_entries(me, peers, now)
        };
        assert_eq!(view("a").unserved_tiers(true, now), vec![prio, default]);
        assert_eq!(view("c").unserved_tiers(true, now), vec![prio]);
        // A stale view: nothing to preempt for.
        assert!(view("a")
            .unserved_tiers(true, now + VIEW_FRESH_FOR)
            .is_empty());
        assert!(!PeerView::default().anyone_preemptible(now));
    }

    #[test]
    fn the_peers_calls_are_counted_per_worker_and_their_promises_apart() {
        let now = Instant::now();
        let peer = |calls: Vec<(&str, u32)>, in_use| Entry {
            in_use,
            calls: calls.into_iter().map(|(a, n)| (a.to_owned(), n)).collect(),
            ..Entry::default()
        };
        let view = PeerView::from_entries(
            "a",
            [
                ("b".into(), peer(vec![("w1", 2), ("w2", 1)], 4)),
                ("c".into(), peer(vec![("w1", 1)], 1)),
            ],
            now,
        );
        assert_eq!(
            (
                view.calls_on("w1"),
                view.calls_on("w2"),
                view.calls_on("w3")
            ),
            (3, 1, 0)
        );
        assert_eq!(view.in_use(now), 5);
        assert_eq!(view.promised(now), 1, "b granted one not yet on a worker");
        assert_eq!(view.promised(now + VIEW_FRESH_FOR), 0);
    }
}
