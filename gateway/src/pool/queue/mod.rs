//! The pool's queue: when every worker of a model is busy, its requests
//! wait here, in the gateway, rather than in the workers' own FIFO queues,
//! so the gateway decides who goes next.
//!
//! The order of service: tier first (`priority`, then `default`, then
//! `flex`: [`ServiceTier`]), then, within a tier, the organisation that has
//! received the least weighted service goes first: a virtual token counter
//! per organisation (VTC; Sheng et al., "Fairness in Serving Large
//! Language Models", OSDI 2024). A request adds its prompt tokens when it is
//! dispatched and twice its output tokens when it ends, divided by its
//! plan's weight; an organisation that becomes active starts at the lowest
//! counter of those already active, so idling earns no credit. Requests of
//! one organisation keep their arrival order. A request waits at most the
//! pool's `queue_timeout_ms`, and no more than `queue_max_depth` wait: then
//! it is refused (503 `server_overloaded` with `Retry-After`).
//!
//! A full queue refuses the newest request of the organisation holding the
//! most places in the lowest tier waiting, the newcomer counted (so the
//! newcomer itself when it is of that organisation and tier, or of a tier
//! below everything waiting). So one organisation's flood fills the queue
//! but cannot keep the others out: each newcomer of another organisation
//! takes the place of the flood's newest request; and a flood of `flex`
//! work cannot keep `priority` requests out.
//!
//! On a draining replica (SIGTERM) the requests that have not started are
//! answered at once (503 `replica_shutdown`): their clients retry on a
//! peer rather than wait out the grace period here ([`PoolQueue::drain`]).
//!
//! Without Redis, counters are this replica's and it orders its own
//! waiting requests. With Redis, the order holds for the pool across
//! replicas ([`super::peers`]): the counters are shared, each replica
//! publishes its best waiters' ranks and the slots it holds, and a replica
//! leaves a free slot to a peer whose waiter goes before its own.

mod shared;
mod turn;

pub use turn::Turn;
use turn::Waiting;

use super::peers::{Entry, Link, PeerView};
use super::preempt::{PreemptPolicy, Preemptible};
use super::Members;
use crate::accounts::ServiceTier;
use crate::metrics::METRICS;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What an output token weighs against a prompt token (the paper's
/// w_q = 2 w_p: decoding a token costs a GPU more than prefilling one).
const OUTPUT_WEIGHT: f64 = 2.0;

/// Organisations remembered per pool before idle ones are forgotten.
const MAX_REMEMBERED_ORGS: usize = 4096;

/// Who is asking, for the order of service.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub org: Arc<str>,
    pub tier: ServiceTier,
    /// The plan's weight (1 = one share).
    pub weight: u32,
    /// Prompt tokens (the admission estimate), charged at dispatch.
    pub input_tokens: u64,
    /// Where its generation stands, for a drain and a full queue.
    pub stage: Stage,
    /// Times its generation was preempted so far.
    pub preemptions: u32,
}

/// Where a waiting generation stands. Only a request that has not started
/// is a queued request: a draining replica answers it at once, and a full
/// queue may refuse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// A client's request no worker has started: a draining replica
    /// answers it 503 `replica_shutdown` at once (its client retries on a
    /// peer).
    New,
    /// A background run no worker has started: on a drain its owner hands
    /// it to a peer (`runs::background`), or it waits here when no peer
    /// could take it; the queue does not answer it.
    Detached,
    /// A generation that already started and waits for a worker to
    /// continue it (moving off a failed worker, or paused by preemption).
    /// Not a queued request: it goes first in its tier, the queue's
    /// timeout and a full queue never refuse it (its request deadline
    /// still holds), and a drain ends it in band or hands it over like a
    /// running one, never from here.
    Started,
}

/// Why a request was not dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// `queue_max_depth` requests were already waiting.
    Full,
    /// It waited `queue_timeout_ms`.
    Timeout,
    /// The replica is draining: a request that has not started goes to a
    /// peer rather than wait here.
    Draining,
}

impl Shed {
    pub fn as_str(self) -> &'static str {
        match self {
            Shed::Full => "queue_full",
            Shed::Timeout => "queue_timeout",
            Shed::Draining => "draining",
        }
    }
}

/// How long requests may wait, and how many.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    pub max_wait: Duration,
    pub max_depth: usize,
    /// Which running generations a higher tier's waiting request preempts.
    pub preempt: PreemptPolicy,
}

/// One pool's queue.
pub struct PoolQueue {
    model: String,
    limits: QueueLimits,
    /// The pool's workers, whose free slots say how many may go.
    members: Arc<Members>,
    state: Mutex<State>,
    /// With Redis: the sync task that shares the order with the peers.
    link: Option<Arc<Link>>,
}

#[derive(Default)]
struct State {
    /// Waiting requests by tier (index: `ServiceTier as usize`).
    waiting: [VecDeque<Waiter>; 3],
    /// Dispatched turns not yet holding a worker slot: capacity they will
    /// take, not yet visible in the workers' counts.
    granted: u32,
    /// Per organisation: its virtual counter and its requests waiting or
    /// running here.
    orgs: HashMap<Arc<str>, OrgState>,
    next_id: u64,
    /// The replica is draining: requests that have not started do not wait.
    draining: bool,
    /// Running generations a higher tier may preempt.
    preemptible: Preemptible,
    /// The peers' waiters and slots, as last read (empty without Redis).
    peers: PeerView,
    /// Counter changes not yet in the shared counters, per organisation:
    /// (increment, floor). Only kept with Redis.
    pending: HashMap<Arc<str>, (f64, f64)>,
    /// Counters are shared (Redis): keep `pending`.
    shared: bool,
    /// The entry last published.
    published: Option<Entry>,
}

#[derive(Debug, Default, Clone, Copy)]
struct OrgState {
    counter: f64,
    active: u32,
}

struct Waiter {
    id: u64,
    ticket: Ticket,
    since: Instant,
    /// `Ok`: its turn; `Err`: refused (a full queue made room for another,
    /// or the replica is draining).
    grant: oneshot::Sender<Result<(), Shed>>,
}

impl PoolQueue {
    /// A queue; with `link`, its order is shared with the other replicas
    /// (a [`super::peers::sync`] task serves the link).
    pub fn new(
        model: &str,
        limits: QueueLimits,
        members: Arc<Members>,
        link: Option<Arc<Link>>,
    ) -> Self {
        Self {
            model: model.to_owned(),
            limits,
            members,
            state: Mutex::new(State {
                shared: link.is_some(),
                ..State::default()
            }),
            link,
        }
    }

    /// The state changed in a way the peers may act on: the sync task
    /// publishes it (coalesced; never waited for).
    fn touch(&self) {
        if let Some(link) = &self.link {
            link.changed.notify_one();
        }
    }

    /// Whether the view of the peers is current enough to grant on (always
    /// without Redis). A view a heartbeat old may miss what a busy peer
    /// granted since, and a request sent on it would wait in a worker's
    /// own queue where nothing preempts for it: the queue asks for a sync
    /// first, whose dispatch grants. A view past trusting (Redis away) is
    /// set aside: the replica orders alone.
    fn view_current(&self, st: &State, now: Instant) -> bool {
        self.link.is_none() || st.peers.current_for_grants(now)
    }

    /// Free worker slots for this replica's waiters: the workers' free
    /// slots less those the peers hold (as last read).
    fn free(&self, st: &State, now: Instant) -> u32 {
        // The peers' calls are in the workers' free slots already (each
        // worker's load counts them, `incoming`); what they promised to
        // requests not yet on a worker is not.
        self.members
            .free_slots()
            .saturating_sub(st.peers.promised(now))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a turn to send `ticket`'s request to a worker: at once if
    /// nobody waits and a worker slot is free. Dropping the future leaves
    /// the queue.
    pub async fn enter(self: &Arc<Self>, ticket: Ticket) -> Result<Turn, Shed> {
        let tier = ticket.tier;
        let waiting = {
            let mut st = self.lock();
            let now = Instant::now();
            st.activate(&ticket.org, now);
            let nobody_waits = st.waiting.iter().all(VecDeque::is_empty);
            // Peers' waiters that go before this one keep their slots.
            let ahead = st.peers.better_than(&st.rank(&ticket), now) as u32;
            if nobody_waits
                && self.view_current(&st, now)
                && self.free(&st, now) > st.granted.saturating_add(ahead)
            {
                st.charge(
                    &self.model,
                    &ticket.org,
                    ticket.input_tokens as f64,
                    ticket.weight,
                );
                st.granted += 1;
                drop(st);
                self.touch();
                self.observe_wait(tier, Duration::ZERO);
                return Ok(Turn::new(self, ticket));
            }
            if st.draining && ticket.stage == Stage::New {
                st.deactivate(&ticket.org);
                drop(st);
                self.count_shed(Shed::Draining, &ticket.org);
                return Err(Shed::Draining);
            }
            // A generation that started is never refused by a full queue.
            if st.depth() >= self.limits.max_depth && ticket.stage != Stage::Started {
                match st.to_refuse(&ticket) {
                    // Its `Waiting` counts the shed and leaves the org.
                    Some((tier, index)) => {
                        if let Some(displaced) = st.waiting[tier].remove(index) {
                            let _ = displaced.grant.send(Err(Shed::Full));
                        }
                    }
                    None => {
                        st.deactivate(&ticket.org);
                        drop(st);
                        self.count_shed(Shed::Full, &ticket.org);
                        return Err(Shed::Full);
                    }
                }
            }
            let (tx, rx) = oneshot::channel();
            let id = st.next_id;
            st.next_id += 1;
            st.waiting[tier as usize].push_back(Waiter {
                id,
                ticket: ticket.clone(),
                since: Instant::now(),
                grant: tx,
            });
            self.publish_depth(&st);
            self.touch();
            Waiting {
                queue: Arc::clone(self),
                id,
                org: Arc::clone(&ticket.org),
                rx,
                done: false,
            }
        };
        // Capacity may have come free between the check and the push.
        self.dispatch();
        waiting.wait(ticket, self.limits.max_wait).await
    }

    /// Hands out turns while free worker slots are not yet promised: best
    /// tier first, the least served organisation within it. Called when
    /// capacity may have come free: a call ended, workers reported.
    pub fn dispatch(&self) {
        let mut st = self.lock();
        let now = Instant::now();
        if !self.view_current(&st, now) {
            // The sync this asks for dispatches with what it reads.
            drop(st);
            self.touch();
            return;
        }
        if st.depth() == 0 {
            // Peers' waiters may still want this replica's levers.
            let free = self.free(&st, now);
            self.preempt(&mut st, free, now);
            return;
        }
        let free = self.free(&st, now);
        let mut changed = false;
        // Slots left to the peers' waiters that go before ours.
        let mut left = 0u32;
        while free > st.granted.saturating_add(left) {
            let Some((tier, index)) = st.next_waiter() else {
                break;
            };
            if let Some(w) = st.waiting[tier].get(index) {
                let ahead = st.peers.better_than(&st.rank(&w.ticket), now) as u32;
                if ahead > left {
                    left += 1;
                    continue;
                }
            }
            let Some(waiter) = st.waiting[tier].remove(index) else {
                break;
            };
            changed = true;
            // A waiter that left (its future dropped) takes nothing.
            if waiter.grant.is_closed() {
                continue;
            }
            let t = &waiter.ticket;
            st.charge(&self.model, &t.org, t.input_tokens as f64, t.weight);
            st.granted += 1;
            if waiter.grant.send(Ok(())).is_err() {
                st.granted -= 1;
                continue;
            }
            let waited = waiter.since.elapsed();
            self.observe_wait(waiter.ticket.tier, waited);
        }
        if changed {
            self.publish_depth(&st);
        }
        if left > 0 {
            if let Some(link) = &self.link {
                // The peer learns now, not at the next heartbeat.
                link.deferred
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if changed || left > 0 {
            self.touch();
        }
        // The slots left to peers serve the peers' waiters in `preempt`'s
        // count, so no lever is pulled for a waiter a slot already serves.
        self.preempt(&mut st, free, now);
    }

    /// Requests still waiting once free slots went: for those of a higher
    /// tier than running preemptible work, preempt it (their turns come
    /// when the preempted calls release their slots). With peers, their
    /// waiters that their own replicas cannot serve count too (this
    /// replica's share of them, [`PeerView::unserved_tiers`]); the slot
    /// so freed is left to the peer by `dispatch`.
    fn preempt(&self, st: &mut State, free: u32, now: Instant) {
        if self.limits.preempt.max_per_generation == 0 {
            return;
        }
        let free = free.saturating_sub(st.granted);
        let for_peers = st.peers.unserved_tiers(st.preemptible.any_pullable(), now);
        if st.depth() == 0 && for_peers.is_empty() {
            return;
        }
        let mut tiers: Vec<ServiceTier> = ServiceTier::BY_PRECEDENCE
            .iter()
            .flat_map(|t| std::iter::repeat_n(*t, st.waiting[*t as usize].len()))
            .chain(for_peers)
            .collect();
        // Best first, as `preempt_for` takes them.
        tiers.sort_by(|a, b| b.cmp(a));
        let best = tiers.first().copied();
        let preempted = st.preemptible.preempt_for(tiers.into_iter(), free);
        if preempted.is_empty() && best > Some(ServiceTier::Flex) {
            // Why a higher tier waits: no generation below it may be
            // preempted now (its tier, its preemptions spent, or no output
            // yet to resume from).
            tracing::debug!(model = %self.model, ?best, free, pullable = st.preemptible.holding(), "a higher tier waits and nothing may be preempted");
        }
        if !preempted.is_empty() {
            tracing::debug!(model = %self.model, preempted = preempted.len(), "preempting for a higher tier");
            // The peers count this replica's pulled levers as serving
            // their waiters: tell them.
            self.touch();
        }
    }

    /// The replica is draining: every waiting request that has not started
    /// is answered now ([`Shed::Draining`]), and later ones that would wait
    /// are answered at once. Background runs and continuations stay (see
    /// [`Stage`]), and whatever can go still goes as capacity frees.
    pub fn drain(&self) {
        let mut st = self.lock();
        st.draining = true;
        let mut refused = Vec::new();
        for queue in &mut st.waiting {
            let (new, kept): (VecDeque<Waiter>, VecDeque<Waiter>) = std::mem::take(queue)
                .into_iter()
                .partition(|w| w.ticket.stage == Stage::New);
            *queue = kept;
            refused.extend(new);
        }
        self.publish_depth(&st);
        drop(st);
        // Each one's `Waiting` counts the shed and leaves the org.
        for waiter in refused {
            let _ = waiter.grant.send(Err(Shed::Draining));
        }
    }

    /// Requests waiting now, all tiers.
    #[cfg(test)]
    fn depth(&self) -> usize {
        self.lock().depth()
    }

    fn observe_wait(&self, tier: ServiceTier, waited: Duration) {
        METRICS
            .queue_wait
            .with_label_values(&[&self.model, tier.as_str()])
            .observe(waited.as_secs_f64());
    }

    /// Counts a refusal, by the organisation refused: its values are the
    /// account store's organisations (never client input), as on the usage
    /// and queue-served series.
    fn count_shed(&self, why: Shed, org: &str) {
        METRICS
            .queue_shed
            .with_label_values(&[&self.model, why.as_str(), org])
            .inc();
    }

    fn publish_depth(&self, st: &State) {
        for tier in ServiceTier::BY_PRECEDENCE {
            METRICS
                .queue_depth
                .with_label_values(&[&self.model, tier.as_str()])
                .set(st.waiting[tier as usize].len() as i64);
        }
    }
}

impl State {
    fn depth(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum()
    }

    /// The waiter a full queue refuses to let `newcomer` in, as (tier,
    /// index); `None`: the newcomer itself. In the lowest tier with a
    /// request waiting (continuations aside: see [`Stage`]), the
    /// organisation holding the most places, the newcomer counted, gives up
    /// its newest: the newcomer when it is of that organisation (it is the
    /// newest of all), and on a tie the newest of the tied. A newcomer of a
    /// tier below everything waiting is refused.
    fn to_refuse(&self, newcomer: &Ticket) -> Option<(usize, usize)> {
        let refusable = |w: &&Waiter| w.ticket.stage != Stage::Started;
        let lowest = ServiceTier::BY_PRECEDENCE
            .iter()
            .rev()
            .find(|t| self.waiting[**t as usize].iter().any(|w| refusable(&w)))?;
        if newcomer.tier < *lowest {
            return None;
        }
        let queue = &self.waiting[*lowest as usize];
        let mut places: HashMap<&str, usize> = HashMap::new();
        for w in queue.iter().filter(refusable) {
            *places.entry(&*w.ticket.org).or_default() += 1;
        }
        let joins = newcomer.tier == *lowest;
        if joins {
            *places.entry(&*newcomer.org).or_default() += 1;
        }
        let most = places.values().copied().max()?;
        if joins && places.get(&*newcomer.org) == Some(&most) {
            return None;
        }
        queue
            .iter()
            .rposition(|w| refusable(&w) && places.get(&*w.ticket.org) == Some(&most))
            .map(|index| (*lowest as usize, index))
    }

    /// The next waiter to serve: the best tier with anyone waiting; in it,
    /// a generation that already started (moved or preempted: it resumes
    /// before new work of its tier), else the first request of the
    /// organisation with the lowest counter.
    fn next_waiter(&self) -> Option<(usize, usize)> {
        ServiceTier::BY_PRECEDENCE.iter().find_map(|tier| {
            let queue = &self.waiting[*tier as usize];
            if let Some(i) = queue.iter().position(|w| w.ticket.stage == Stage::Started) {
                return Some((*tier as usize, i));
            }
            let mut best: Option<(usize, f64)> = None;
            for (i, w) in queue.iter().enumerate() {
                let c = self.orgs.get(&w.ticket.org).map_or(0.0, |o| o.counter);
                if best.is_none_or(|(_, b)| c < b) {
                    best = Some((i, c));
                }
            }
            best.map(|(i, _)| (*tier as usize, i))
        })
    }

    /// An organisation's request arrives: one that was idle starts at the
    /// lowest counter among the active ones (no credit for idling).
    fn activate(&mut self, org: &Arc<str>, now: Instant) {
        if self.orgs.get(org).is_none_or(|o| o.active == 0) {
            // With peers, their active organisations count too.
            let floor = match (self.active_floor(), self.peers.floor(now)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if self.orgs.len() >= MAX_REMEMBERED_ORGS {
                self.orgs.retain(|_, o| o.active > 0);
            }
            let entry = self.orgs.entry(Arc::clone(org)).or_default();
            if let Some(floor) = floor {
                entry.counter = entry.counter.max(floor);
                if self.shared {
                    let p = self.pending.entry(Arc::clone(org)).or_default();
                    p.1 = p.1.max(floor);
                }
            }
        }
        if let Some(o) = self.orgs.get_mut(org) {
            o.active += 1;
        }
    }

    /// One of an organisation's requests ends (or leaves the queue). When
    /// nobody is active any more, every counter starts again from zero.
    fn deactivate(&mut self, org: &Arc<str>) {
        if let Some(o) = self.orgs.get_mut(org) {
            o.active = o.active.saturating_sub(1);
        }
        if self.orgs.values().all(|o| o.active == 0) {
            self.orgs.clear();
        }
    }

    fn charge(&mut self, model: &str, org: &Arc<str>, tokens: f64, weight: u32) {
        let weighted = tokens / f64::from(weight.max(1));
        if let Some(o) = self.orgs.get_mut(org) {
            o.counter += weighted;
        }
        if self.shared && weighted > 0.0 {
            self.pending.entry(Arc::clone(org)).or_default().0 += weighted;
        }
        if weighted > 0.0 {
            METRICS
                .queue_served
                .with_label_values(&[model, org])
                .inc_by(weighted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::peers::{Incoming, Outgoing, Rank, SharedOrder};
    use crate::pool::WorkerEndpoint;

    /// A queue over one worker with `capacity` slots, none in use.
    fn queue(
        capacity: u32,
        max_depth: usize,
        max_wait: Duration,
    ) -> (Arc<PoolQueue>, Arc<WorkerEndpoint>) {
        let endpoint = Arc::new(WorkerEndpoint::new("127.0.0.1:1", None).unwrap());
        endpoint.record_check(true, Some((0, 0, capacity, false)));
        let members = Arc::new(Members::default());
        members.replace(vec![Arc::clone(&endpoint)]);
        let limits = QueueLimits {
            max_wait,
            max_depth,
            preempt: PreemptPolicy {
                tiers: [true, false, false],
                max_per_generation: 1,
            },
        };
        (
            Arc::new(PoolQueue::new("base", limits, members, None)),
            endpoint,
        )
    }

    fn ticket(org: &str, tier: ServiceTier) -> Ticket {
        Ticket {
            preemptions: 0,
            org: org.into(),
            tier,
            weight: 1,
            input_tokens: 100,
            stage: Stage::New,
        }
    }

    /// Enters, and takes the worker slot the turn was promised.
    async fn run(
        q: &Arc<PoolQueue>,
        endpoint: &WorkerEndpoint,
        t: Ticket,
    ) -> (Turn, crate::pool::endpoint::InflightSlot) {
        let mut turn = q.enter(t).await.expect("a turn");
        let slot = endpoint.acquire();
        turn.started();
        (turn, slot)
    }

    /// Spawns a waiter that reports its name when its turn comes, then
    /// holds the turn until told to end.
    fn waiter(
        q: &Arc<PoolQueue>,
        endpoint: &Arc<WorkerEndpoint>,
        name: &'static str,
        t: Ticket,
        served: tokio::sync::mpsc::UnboundedSender<&'static str>,
    ) -> oneshot::Sender<u64> {
        let (end_tx, end_rx) = oneshot::channel::<u64>();
        let (q, endpoint) = (Arc::clone(q), Arc::clone(endpoint));
        tokio::spawn(async move {
            let (turn, slot) = run(&q, &endpoint, t).await;
            let _ = served.send(name);
            let output = end_rx.await.unwrap_or(0);
            turn.served(output);
            drop(slot);
            drop(turn);
        });
        end_tx
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_free_worker_means_no_wait() {
        let (q, endpoint) = queue(2, 8, Duration::from_secs(1));
        let _a = run(&q, &endpoint, ticket("a", ServiceTier::Default)).await;
        let _b = run(&q, &endpoint, ticket("b", ServiceTier::Flex)).await;
        assert_eq!(q.depth(), 0);
    }

    /// Ends each request as it gets its turn (each generated `output`
    /// tokens) and returns the names in the order they were served.
    async fn serve_all(
        mut ends: HashMap<&'static str, Vec<oneshot::Sender<u64>>>,
        served: &mut tokio::sync::mpsc::UnboundedReceiver<&'static str>,
        output: u64,
    ) -> Vec<&'static str> {
        let mut order = Vec::new();
        while let Ok(Some(name)) = tokio::time::timeout(Duration::from_secs(2), served.recv()).await
        {
            order.push(name);
            if let Some(end) = ends
                .get_mut(name)
                .and_then(|v| (!v.is_empty()).then(|| v.remove(0)))
            {
                let _ = end.send(output);
            }
            if ends.values().all(Vec::is_empty) {
                break;
            }
        }
        order
    }

    #[tokio::test]
    async fn a_higher_tier_goes_first_then_the_least_served_organisation() {
        let (q, endpoint) = queue(1, 8, Duration::from_secs(5));
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let mut ends: HashMap<&'static str, Vec<oneshot::Sender<u64>>> = HashMap::new();
        let first = waiter(
            &q,
            &endpoint,
            "a1",
            ticket("a", ServiceTier::Default),
            tx.clone(),
        );
        ends.entry("a1").or_default().push(first);
        settle().await;
        // While a1 runs: more from a, then one flex request, one from b, one
        // priority request, in that order of arrival.
        let later = [
            ("a2", "a", ServiceTier::Default),
            ("a3", "a", ServiceTier::Default),
            ("a4", "a", ServiceTier::Default),
            ("flex", "c", ServiceTier::Flex),
            ("b1", "b", ServiceTier::Default),
            ("prio", "d", ServiceTier::Priority),
        ];
        for (name, org, tier) in later {
            let end = waiter(&q, &endpoint, name, ticket(org, tier), tx.clone());
            ends.entry(name).or_default().push(end);
            settle().await;
        }
        assert_eq!(q.depth(), 6);
        let order = serve_all(ends, &mut served, 50).await;
        // b arrived after a's requests but had received nothing: it goes
        // before a's second one; a's own requests keep their order.
        assert_eq!(order, ["a1", "prio", "b1", "a2", "a3", "a4", "flex"]);
    }

    #[tokio::test]
    async fn equal_backlogged_organisations_alternate_and_weights_share_unevenly() {
        let (q, endpoint) = queue(1, 64, Duration::from_secs(5));
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let weighted = |org: &str, weight| Ticket {
            weight,
            ..ticket(org, ServiceTier::Default)
        };
        let mut ends: HashMap<&'static str, Vec<oneshot::Sender<u64>>> = HashMap::new();
        let first = waiter(&q, &endpoint, "x", weighted("x", 1), tx.clone());
        ends.entry("x").or_default().push(first);
        settle().await;
        for _ in 0..6 {
            let a = waiter(&q, &endpoint, "a", weighted("a", 1), tx.clone());
            ends.entry("a").or_default().push(a);
            let b = waiter(&q, &endpoint, "b", weighted("b", 2), tx.clone());
            ends.entry("b").or_default().push(b);
            settle().await;
        }
        let order: String = serve_all(ends, &mut served, 50).await.concat();
        assert_eq!(order.len(), 13, "{order}");
        // b's plan weighs twice a's: two of b's for one of a's while both
        // wait, then what is left of a's.
        assert_eq!(&order[..10], "xabbabbabb", "{order}");
    }

    #[tokio::test]
    async fn a_full_queue_and_a_long_wait_are_refused_and_leave_nothing_behind() {
        let (q, endpoint) = queue(1, 1, Duration::from_millis(100));
        let busy = run(&q, &endpoint, ticket("a", ServiceTier::Default)).await;
        let q2 = Arc::clone(&q);
        let waiting =
            tokio::spawn(async move { q2.enter(ticket("b", ServiceTier::Default)).await.err() });
        settle().await;
        assert_eq!(q.depth(), 1);
        let full = q.enter(ticket("c", ServiceTier::Default)).await.err();
        assert_eq!(full, Some(Shed::Full));
        assert_eq!(waiting.await.unwrap(), Some(Shed::Timeout));
        assert_eq!(q.depth(), 0);
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        // The worker is free again: nothing is held for the ones refused.
        let _next = run(&q, &endpoint, ticket("d", ServiceTier::Default)).await;
    }

    #[tokio::test]
    async fn a_full_queue_refuses_the_newest_of_a_lower_tier_to_take_a_higher_one() {
        let (q, endpoint) = queue(1, 2, Duration::from_secs(5));
        let busy = run(&q, &endpoint, ticket("a", ServiceTier::Flex)).await;
        let enter = |org: &'static str, tier| {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.enter(ticket(org, tier)).await.map(|_turn| ()) })
        };
        let older_flex = enter("a", ServiceTier::Flex);
        settle().await;
        let newer_flex = enter("a", ServiceTier::Flex);
        settle().await;
        assert_eq!(q.depth(), 2);
        // A priority request finds the queue full: the newest flex makes room.
        let priority = enter("b", ServiceTier::Priority);
        settle().await;
        assert_eq!(newer_flex.await.unwrap().err(), Some(Shed::Full));
        assert_eq!(q.depth(), 2);
        // A flex request at a queue full of equal or higher tiers is refused.
        let late_flex = q.enter(ticket("c", ServiceTier::Flex)).await.err();
        assert_eq!(late_flex, Some(Shed::Full));
        // The priority request goes first, then the older flex.
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        assert!(priority.await.unwrap().is_ok());
        assert!(older_flex.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_gives_its_place_to_the_next() {
        let (q, endpoint) = queue(1, 8, Duration::from_secs(5));
        let busy = run(&q, &endpoint, ticket("a", ServiceTier::Default)).await;
        let q2 = Arc::clone(&q);
        let leaver =
            tokio::spawn(async move { q2.enter(ticket("b", ServiceTier::Default)).await.is_ok() });
        settle().await;
        leaver.abort();
        let _ = leaver.await;
        assert_eq!(q.depth(), 0, "the one that left is out of the queue");
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let _c = waiter(&q, &endpoint, "c", ticket("c", ServiceTier::Default), tx);
        settle().await;
        // As a call's guard does: the worker slot first, then the turn.
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        let next = tokio::time::timeout(Duration::from_secs(1), served.recv()).await;
        assert_eq!(next.ok().flatten(), Some("c"));
    }

    fn shed_count(why: Shed, org: &str) -> u64 {
        METRICS
            .queue_shed
            .with_label_values(&["base", why.as_str(), org])
            .get()
    }

    #[tokio::test]
    async fn a_full_queue_refuses_the_newest_of_the_organisation_holding_most_places() {
        let (q, endpoint) = queue(1, 3, Duration::from_secs(5));
        let busy = run(&q, &endpoint, ticket("x", ServiceTier::Default)).await;
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let enter = |name: &'static str, org: &'static str| {
            let (q, endpoint, tx) = (Arc::clone(&q), Arc::clone(&endpoint), tx.clone());
            tokio::spawn(async move {
                let (turn, slot) = match q.enter(ticket(org, ServiceTier::Default)).await {
                    Ok(turn) => (turn, endpoint.acquire()),
                    Err(why) => return Err(why),
                };
                let _ = tx.send(name);
                drop(slot);
                drop(turn);
                Ok(())
            })
        };
        let shed_before = shed_count(Shed::Full, "flood");
        // The flood fills the queue.
        let a1 = enter("a1", "flood");
        settle().await;
        let a2 = enter("a2", "flood");
        settle().await;
        let a3 = enter("a3", "flood");
        settle().await;
        assert_eq!(q.depth(), 3);
        // Another organisation's request takes the place of the flood's
        // newest, rather than being refused.
        let b = enter("b", "other");
        settle().await;
        assert_eq!(a3.await.unwrap(), Err(Shed::Full));
        assert_eq!(q.depth(), 3);
        // The flood's next request is its own newest: refused at once.
        let a4 = enter("a4", "flood");
        assert_eq!(a4.await.unwrap(), Err(Shed::Full));
        assert_eq!(shed_count(Shed::Full, "flood") - shed_before, 2);
        assert_eq!(shed_count(Shed::Full, "other"), 0);
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        for waiter in [a1, a2, b] {
            assert_eq!(waiter.await.unwrap(), Ok(()));
        }
        let mut order = Vec::new();
        while let Ok(name) = served.try_recv() {
            order.push(name);
        }
        assert_eq!(order, ["a1", "b", "a2"]);
    }

    #[tokio::test]
    async fn a_drain_answers_the_requests_waiting_and_keeps_runs_and_continuations() {
        let (q, endpoint) = queue(1, 8, Duration::from_secs(5));
        let busy = run(&q, &endpoint, ticket("a", ServiceTier::Default)).await;
        let at = |stage| Ticket {
            stage,
            ..ticket("drained", ServiceTier::Default)
        };
        let enter = |t: Ticket| {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.enter(t).await.map(|_turn| ()) })
        };
        let request = enter(at(Stage::New));
        settle().await;
        let background = enter(at(Stage::Detached));
        settle().await;
        let continuation = enter(at(Stage::Started));
        settle().await;
        assert_eq!(q.depth(), 3);
        let before = shed_count(Shed::Draining, "drained");
        q.drain();
        // The request that had not started is answered now, not when the
        // grace period ends; the others wait on.
        let answered = tokio::time::timeout(Duration::from_secs(1), request).await;
        assert_eq!(answered.expect("at once").unwrap(), Err(Shed::Draining));
        assert_eq!(q.depth(), 2);
        // A later one that would have to wait is answered at once.
        let late = q.enter(at(Stage::New)).await.err();
        assert_eq!(late, Some(Shed::Draining));
        assert_eq!(shed_count(Shed::Draining, "drained") - before, 2);
        // What stayed goes as capacity frees.
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        assert_eq!(background.await.unwrap(), Ok(()));
        assert_eq!(continuation.await.unwrap(), Ok(()));
        // A free worker still serves a request on a draining replica.
        let _now = run(&q, &endpoint, at(Stage::New)).await;
    }

    #[tokio::test]
    async fn a_full_queue_never_refuses_a_continuation() {
        let (q, endpoint) = queue(1, 1, Duration::from_secs(5));
        let busy = run(&q, &endpoint, ticket("a", ServiceTier::Default)).await;
        let q2 = Arc::clone(&q);
        let continuation = tokio::spawn(async move {
            let t = Ticket {
                stage: Stage::Started,
                ..ticket("a", ServiceTier::Flex)
            };
            q2.enter(t).await.map(|_turn| ())
        });
        settle().await;
        let refused = q.enter(ticket("b", ServiceTier::Priority)).await.err();
        assert_eq!(refused, Some(Shed::Full));
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        assert_eq!(continuation.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn a_higher_tier_waiting_on_a_full_pool_preempts_the_flex_call_and_takes_its_slot() {
        let (q, endpoint) = queue(1, 8, Duration::from_secs(5));
        let (mut flex, flex_slot) = run(&q, &endpoint, ticket("a", ServiceTier::Flex)).await;
        let lever = flex.preemptible().expect("flex may be preempted");
        lever.note(3, true);
        let q2 = Arc::clone(&q);
        let priority = tokio::spawn(async move {
            q2.enter(ticket("b", ServiceTier::Priority))
                .await
                .map(|_turn| ())
        });
        tokio::time::timeout(Duration::from_secs(1), lever.pulled())
            .await
            .expect("the flex call is preempted");
        // Its slot goes to the waiting priority request, not to a newcomer.
        drop(flex_slot);
        drop(flex);
        assert_eq!(priority.await.unwrap(), Ok(()));
        // Resumed, it cannot be preempted again (the limit is one), and a
        // default request never preempts: only flex is preemptible here.
        let (mut resumed, _slot) = run(
            &q,
            &endpoint,
            Ticket {
                stage: Stage::Started,
                preemptions: 1,
                ..ticket("a", ServiceTier::Flex)
            },
        )
        .await;
        assert!(resumed.preemptible().is_none());
        let (mut default, _slot2) = {
            let q = Arc::clone(&q);
            let endpoint = Arc::clone(&endpoint);
            drop(resumed);
            drop(_slot);
            run(&q, &endpoint, ticket("c", ServiceTier::Default)).await
        };
        assert!(default.preemptible().is_none());
    }

    #[tokio::test]
    async fn a_paused_generation_waits_past_the_queue_timeout() {
        let (q, endpoint) = queue(1, 8, Duration::from_millis(50));
        let busy = run(&q, &endpoint, ticket("a", ServiceTier::Default)).await;
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let paused = Ticket {
            stage: Stage::Started,
            preemptions: 1,
            ..ticket("c", ServiceTier::Flex)
        };
        let _paused = waiter(&q, &endpoint, "paused", paused, tx);
        tokio::time::sleep(Duration::from_millis(120)).await;
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        assert_eq!(served.recv().await, Some("paused"));
    }

    #[tokio::test]
    async fn a_paused_generation_goes_first_in_its_tier() {
        let (q, endpoint) = queue(1, 8, Duration::from_secs(5));
        let busy = run(&q, &endpoint, ticket("a", ServiceTier::Default)).await;
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let _new = waiter(
            &q,
            &endpoint,
            "new",
            ticket("b", ServiceTier::Flex),
            tx.clone(),
        );
        settle().await;
        let paused = Ticket {
            stage: Stage::Started,
            preemptions: 1,
            ..ticket("c", ServiceTier::Flex)
        };
        let _paused = waiter(&q, &endpoint, "paused", paused, tx);
        settle().await;
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        assert_eq!(served.recv().await, Some("paused"));
    }

    #[tokio::test]
    async fn a_generation_resuming_into_a_full_queue_is_not_refused() {
        let (q, endpoint) = queue(1, 1, Duration::from_secs(5));
        let busy = run(&q, &endpoint, ticket("a", ServiceTier::Default)).await;
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let _full = waiter(
            &q,
            &endpoint,
            "queued",
            ticket("b", ServiceTier::Priority),
            tx.clone(),
        );
        settle().await;
        let resuming = Ticket {
            stage: Stage::Started,
            preemptions: 1,
            ..ticket("c", ServiceTier::Flex)
        };
        let _resuming = waiter(&q, &endpoint, "resuming", resuming, tx);
        settle().await;
        assert_eq!(q.depth(), 2, "it waits beyond the depth bound");
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        assert_eq!(served.recv().await, Some("queued"));
    }

    /// As a sync would: the peers' entries read now (this replica is "a",
    /// its peers "b", "c", ... in order).
    fn peers_read(q: &PoolQueue, peers: Vec<Entry>) {
        let peers = peers
            .into_iter()
            .enumerate()
            .map(|(i, e)| (format!("{}", char::from(b'b' + i as u8)), e))
            .collect();
        let out = Outgoing {
            entry: Entry::default(),
            counters: Vec::new(),
            active: false,
            nudge: false,
            changed: false,
        };
        let incoming = Incoming {
            me: Arc::from("a"),
            peers,
            counters: HashMap::new(),
        };
        q.incoming(out, incoming, Instant::now());
    }

    fn peer(in_use: u32, ranks: &[(ServiceTier, f64)]) -> Entry {
        Entry {
            in_use,
            calls: Vec::new(),
            levers: 0,
            floor: None,
            ranks: ranks
                .iter()
                .map(|(tier, counter)| Rank {
                    tier: *tier,
                    started: false,
                    counter: *counter,
                })
                .collect(),
        }
    }

    #[tokio::test]
    async fn a_free_slot_goes_to_a_peer_whose_waiter_goes_first_and_the_peers_slots_count() {
        let (q, endpoint) = queue(2, 8, Duration::from_secs(5));
        // A peer has a priority request waiting: of the two free slots,
        // one is left to it.
        peers_read(&q, vec![peer(0, &[(ServiceTier::Priority, 0.0)])]);
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let _first = waiter(
            &q,
            &endpoint,
            "first",
            ticket("a", ServiceTier::Default),
            tx.clone(),
        );
        settle().await;
        assert_eq!(served.try_recv().ok(), Some("first"));
        let _second = waiter(
            &q,
            &endpoint,
            "second",
            ticket("a", ServiceTier::Default),
            tx.clone(),
        );
        settle().await;
        assert_eq!(q.depth(), 1, "the last free slot is the peer's");
        // The peer took it: nothing free here.
        peers_read(&q, vec![peer(1, &[])]);
        q.dispatch();
        settle().await;
        assert_eq!(q.depth(), 1);
        // The peer's call ended: the slot is this replica's again.
        peers_read(&q, vec![peer(0, &[])]);
        q.dispatch();
        settle().await;
        assert_eq!(served.try_recv().ok(), Some("second"));
    }

    #[tokio::test]
    async fn a_peer_s_worse_waiter_or_a_stale_view_leaves_the_order_local() {
        let (q, endpoint) = queue(1, 8, Duration::from_secs(5));
        let busy = run(&q, &endpoint, ticket("x", ServiceTier::Default)).await;
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let _prio = waiter(
            &q,
            &endpoint,
            "prio",
            ticket("b", ServiceTier::Priority),
            tx.clone(),
        );
        settle().await;
        // The peer's default waiter, however little served, goes after a
        // priority one; a flex one of a lower counter too.
        peers_read(
            &q,
            vec![peer(
                0,
                &[(ServiceTier::Default, 0.0), (ServiceTier::Flex, 0.0)],
            )],
        );
        let (turn, slot) = busy;
        drop(slot);
        drop(turn);
        settle().await;
        assert_eq!(served.try_recv().ok(), Some("prio"));
        // A view that was never refreshed (Redis gone) is not acted on.
        let stale = PeerView::from_entries(
            "a",
            [("b".to_owned(), peer(5, &[(ServiceTier::Priority, 0.0)]))],
            Instant::now() - Duration::from_secs(10),
        );
        q.lock().peers = stale;
        let (tx2, mut served2) = tokio::sync::mpsc::unbounded_channel();
        let _late = waiter(&q, &endpoint, "late", ticket("c", ServiceTier::Flex), tx2);
        settle().await;
        assert_eq!(q.depth(), 1, "behind prio, which holds the slot");
        drop(_prio);
        let next = tokio::time::timeout(Duration::from_secs(1), served2.recv()).await;
        assert_eq!(
            next.ok().flatten(),
            Some("late"),
            "a stale view holds neither slots nor waiters"
        );
    }

    #[tokio::test]
    async fn a_peer_s_priority_waiter_preempts_flex_work_here_and_gets_the_slot_it_frees() {
        let (q, endpoint) = queue(1, 8, Duration::from_secs(5));
        let (mut flex, flex_slot) = run(&q, &endpoint, ticket("a", ServiceTier::Flex)).await;
        let lever = flex.preemptible().expect("flex may be preempted");
        lever.note(3, true);
        // A peer with no levers of its own has a priority request waiting
        // (and holds no slot: the one slot is this replica's flex call).
        peers_read(&q, vec![peer(0, &[(ServiceTier::Priority, 0.0)])]);
        q.dispatch();
        assert!(lever.is_pulled(), "preempted for the peer's waiter");
        // Read again before the slot frees: the pulled lever covers the
        // waiter, nothing more is preempted, and this replica now
        // publishes the lever it holds.
        // (One more slot for a moment, so that a second flex call runs
        // beside the peer's waiter.)
        endpoint.record_check(true, Some((0, 0, 3, false)));
        let (mut other, _other_slot) = run(&q, &endpoint, ticket("a", ServiceTier::Flex)).await;
        endpoint.record_check(true, Some((0, 0, 2, false)));
        let second = other.preemptible().expect("flex");
        second.note(1, true);
        peers_read(&q, vec![peer(0, &[(ServiceTier::Priority, 0.0)])]);
        q.dispatch();
        assert!(!second.is_pulled(), "one waiter, one preemption");
        let link = Link::default();
        assert_eq!(q.outgoing(&link).entry.levers, 2);
        // The preempted call ends: its slot is left to the peer, even for
        // the preempted generation waiting here to resume.
        drop(flex_slot);
        drop(flex);
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let _resume = waiter(
            &q,
            &endpoint,
            "resumed",
            Ticket {
                stage: Stage::Started,
                preemptions: 1,
                ..ticket("a", ServiceTier::Flex)
            },
            tx,
        );
        settle().await;
        assert_eq!(q.depth(), 1, "the free slot is the peer's");
        assert!(served.try_recv().is_err());
        // A peer whose own lever serves its waiter: nothing pulled here.
        let mut own = peer(0, &[(ServiceTier::Priority, 0.0)]);
        own.levers = 1;
        peers_read(&q, vec![own]);
        q.dispatch();
        assert!(!second.is_pulled());
    }
}
