//! What a client was told is what the store keeps, through the faults that
//! split a fleet: two gateway replicas on one Redis, each over a link of its
//! own (`harness::replicas`), one cut off or stalled while its peer sweeps.
//!
//! Every test ends by reading the store directly: the stored object equals
//! what its client received, the replay of a run tells the same story as
//! its stored object, one terminal event ends each log, no lease is left.

use harness::replicas::{self, events, eventually, output_text, streamed_text, Replicas};
use harness::{bounded, json, Client, SseFrame, Value, WorkerOpts};
use std::time::Duration;

/// A lease of 1.5 s (renewed every 300 ms) and sweeps every 200 ms: a cut-off
/// replica's runs are swept by its peer within about two seconds.
const SHORT_LEASES: &str =
    "[store]\nlease_millis = 1500\nheartbeat_millis = 300\nsweep_interval_millis = 200\n";

async fn replay(client: &Client, id: &str) -> Vec<(String, Value)> {
    let stream = client
        .open_stream(client.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .expect("replay");
    assert_eq!(stream.status, 200);
    events(&stream.collect().await.expect("replay frames"))
}

/// A background run of `tokens` synthetic tokens; its id.
async fn create_background(client: &Client, tokens: u32) -> String {
    replicas::create_background(client, &format!("synthetic:reply_tokens={tokens} go")).await
}

/// The stored log ends with exactly one terminal event, and the replay of
/// the run and its stored object tell the same story: same text, and the
/// terminal event carries the object as stored.
async fn assert_one_story(r: &Replicas, id: &str) -> Value {
    let object = r.stored_object(id).expect("store").expect("stored");
    let log = r.stored_events(id).expect("log");
    let terminal: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, (n, _))| {
            matches!(
                n.as_str(),
                "response.completed" | "response.failed" | "response.incomplete"
            )
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(terminal, [log.len() - 1], "one terminal event, last: {id}");
    let replayed = replay(&r.b.client(), id).await;
    let text = streamed_text(replayed.iter().map(|(n, d)| (n.as_str(), d)));
    assert_eq!(
        output_text(&object),
        text,
        "the stored object's output is the replayed text ({id})"
    );
    let (_, last) = replayed.last().expect("a terminal event");
    assert_eq!(last["response"], object, "the terminal event is the object");
    object
}

/// How replica A loses Redis.
#[derive(Clone, Copy, Debug, PartialEq)]
enum CutOff {
    /// A's link delivers nothing until healed (writes in flight may land
    /// late); B keeps its link and sweeps.
    Partition,
    /// A's connections reset and new ones refused: nothing sent lands
    /// late, so only a retried write can; B keeps its link and sweeps.
    Refused,
    /// The persistent Redis itself killed and restarted on its data, 2 s
    /// later (both replicas lose it; the audit's 10-of-10 case).
    RedisRestart,
}

/// The audit's first defect: a replica cut off from Redis after its clients
/// received complete replies (a partition of the replica, and a restart of
/// the Redis it reaches). Its peer sweeps the runs as lost while it is
/// away; once back, the owner's final writes replace the sweep, so the
/// store keeps exactly what each client was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_its_client_saw_complete_is_stored_complete_after_the_replica_was_partitioned() {
    stored_as_told_after(CutOff::Partition).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_its_client_saw_complete_is_stored_complete_after_its_redis_link_reset() {
    stored_as_told_after(CutOff::Refused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_its_client_saw_complete_is_stored_complete_across_a_redis_restart() {
    stored_as_told_after(CutOff::RedisRestart).await;
}

async fn stored_as_told_after(cut: CutOff) {
    bounded(90, async {
        let mut r = Replicas::start(WorkerOpts::paced(0, 100), SHORT_LEASES).expect("replicas");
        let body = |stream: bool| {
            json!({"model": "base", "input": "synthetic:reply_tokens=150 go", "stream": stream})
        };
        let plain = tokio::spawn({
            let (client, body) = (r.a.client(), body(false));
            async move { client.post_json("/responses", &body).await }
        });
        let streamed = tokio::spawn({
            let (client, body) = (r.a.client(), body(true));
            async move {
                let s = client.stream("/responses", &body).await?;
                s.collect().await
            }
        });
        // Both are stored and generating; then A loses Redis.
        tokio::time::sleep(Duration::from_millis(700)).await;
        match cut {
            CutOff::Partition => r.link_a.partition(),
            CutOff::Refused => {
                r.link_a.refuse(true);
                r.link_a.drop_connections();
            }
            CutOff::RedisRestart => tokio::task::block_in_place(|| {
                r.redis
                    .restart(Duration::from_secs(2))
                    .expect("Redis restarts")
            }),
        }

        let plain = plain.await.expect("task").expect("plain reply");
        assert_eq!(plain.status, 200, "{plain}");
        let plain = plain.json();
        assert_eq!(plain["status"], "completed");
        let frames = streamed.await.expect("task").expect("streamed reply");
        let streamed = events(&frames);
        let (name, last) = streamed.last().expect("a terminal event");
        assert_eq!(name, "response.completed");
        let streamed = last["response"].clone();
        let told = [plain, streamed];
        for object in &told {
            assert!(!output_text(object).is_empty(), "{object}");
        }

        // While A is away, B takes A for dead and sweeps its runs.
        for object in told.iter().filter(|_| cut != CutOff::RedisRestart) {
            let id = object["id"].as_str().expect("id");
            let swept = eventually(Duration::from_secs(10), "the peer's sweep", || r.logs(), || {
                r.stored_object(id)
                    .ok()
                    .flatten()
                    .filter(|o| o["status"] == "failed")
            })
            .await;
            assert_eq!(swept["error"]["code"], "run_lost", "{swept}");
        }
        r.link_a.heal();
        r.link_a.refuse(false);

        // A's retried final writes land and replace the sweep.
        for object in &told {
            let id = object["id"].as_str().expect("id");
            // The store keeps exactly what the client was told.
            let told_here = || {
                format!(
                    "told {object}\nstored {:?}\n{}",
                    r.stored_object(id),
                    r.logs()
                )
            };
            eventually(Duration::from_secs(15), "the owner's final write", told_here, || {
                r.stored_object(id).ok().flatten().filter(|o| o == object)
            })
            .await;
            let via_b = r.b.client().get(&format!("/responses/{id}")).await.expect("get");
            assert_eq!(&via_b.json(), object);
        }
        eventually(Duration::from_secs(10), "leases released", || r.logs(), || {
            (r.leases_left().ok()? == 0).then_some(())
        })
        .await;
    })
    .await;
}

/// The tolerated store stall is one whole lease (the process contract's
/// bound), tested at the bound: a stall of the store link of exactly one
/// lease, while the peer sweeps. Leases carry a heartbeat of slack and the
/// owner retries its writes for as long as the lease may hold, so no run is
/// taken for lost; every one completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_stall_of_one_whole_lease_loses_no_run() {
    bounded(90, async {
        let leases =
            "[store]\nlease_millis = 3000\nheartbeat_millis = 1000\nsweep_interval_millis = 200\n";
        let r = Replicas::start(WorkerOpts::paced(0, 100), leases).expect("replicas");
        let client = r.a.client();
        let mut ids = Vec::new();
        for _ in 0..6 {
            ids.push(create_background(&client, 900).await);
        }
        // Two stalls of one lease, at unrelated points of the heartbeat's
        // cycle.
        for pause in [700, 1300] {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            r.link_a.stall(Duration::from_millis(3000));
            tokio::time::sleep(Duration::from_millis(3000)).await;
        }
        for id in &ids {
            let object = r.terminal(id, Duration::from_secs(30)).await;
            assert_eq!(object["status"], "completed", "{object}");
            assert_eq!(object["usage"]["output_tokens"], 900);
            assert_one_story(&r, id).await;
        }
    })
    .await;
}

/// The audit's second defect, on cancel: the run cancelled through the
/// other replica keeps what it generated, as `incomplete` content, and the
/// replay ends with that same object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_keeps_what_it_generated() {
    bounded(60, async {
        let r = Replicas::start(WorkerOpts::paced(0, 100), SHORT_LEASES).expect("replicas");
        let id = create_background(&r.a.client(), 600).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let cancelled =
            r.b.client()
                .post_json(&format!("/responses/{id}/cancel"), &json!({}))
                .await
                .expect("cancel");
        assert_eq!(cancelled.status, 200, "{cancelled}");
        let cancelled = cancelled.json();
        assert_eq!(cancelled["status"], "cancelled");
        assert_eq!(
            cancelled["output"][0]["status"], "incomplete",
            "{cancelled}"
        );
        assert!(!output_text(&cancelled).is_empty(), "{cancelled}");
        // The owner stops at its next write; nothing follows the end.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let object = assert_one_story(&r, &id).await;
        assert_eq!(object, cancelled, "the cancel's answer is what is stored");
    })
    .await;
}

/// The audit's second defect, on a sweep: a run whose owner was cut off is
/// failed `run_lost` by the peer with the output its log holds, and the
/// owner, once back, writes nothing after the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swept_run_keeps_what_it_generated() {
    bounded(60, async {
        let r = Replicas::start(WorkerOpts::paced(0, 100), SHORT_LEASES).expect("replicas");
        let id = create_background(&r.a.client(), 800).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        r.link_a.partition();
        let swept = eventually(
            Duration::from_secs(10),
            "the peer's sweep",
            || r.logs(),
            || {
                r.stored_object(&id)
                    .ok()
                    .flatten()
                    .filter(|o| o["status"] == "failed")
            },
        )
        .await;
        assert_eq!(swept["error"]["code"], "run_lost", "{swept}");
        assert!(!output_text(&swept).is_empty(), "{swept}");
        r.link_a.heal();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let object = assert_one_story(&r, &id).await;
        assert_eq!(object, swept, "the owner wrote nothing after the sweep");
        eventually(
            Duration::from_secs(10),
            "leases released",
            || r.logs(),
            || (r.leases_left().ok()? == 0).then_some(()),
        )
        .await;
    })
    .await;
}

/// A worker's link partitioned mid-stream and healed: every run ends once
/// (failed where the stream broke, by the keepalive's verdict), and every
/// stored object tells what its replay shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_whose_worker_was_cut_off_mid_stream_end_once_and_agree_with_their_replay() {
    bounded(90, async {
        let r = Replicas::start(WorkerOpts::paced(0, 100), SHORT_LEASES).expect("replicas");
        let client = r.a.client();
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(create_background(&client, 600).await);
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        r.link_worker.partition();
        tokio::time::sleep(Duration::from_secs(12)).await;
        r.link_worker.heal();
        for id in &ids {
            let object = r.terminal(id, Duration::from_secs(30)).await;
            assert_eq!(object["status"], "failed", "{object}");
            assert!(!output_text(&object).is_empty(), "{object}");
            assert_one_story(&r, id).await;
        }
    })
    .await;
}

/// A replica cut off (its host's cable pulled) and killed while it owns
/// runs: its peer fails every one `run_lost`, each with the output its log
/// holds, and no lease is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_while_cut_off_leaves_no_run_running() {
    bounded(60, async {
        let mut r = Replicas::start(WorkerOpts::paced(0, 100), SHORT_LEASES).expect("replicas");
        let client = r.a.client();
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(create_background(&client, 800).await);
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        r.cut_a().expect("cut A off");
        tokio::time::sleep(Duration::from_millis(300)).await;
        r.a.kill();
        r.reconnect_a().expect("reconnect A's host");
        for id in &ids {
            let object = r.terminal(id, Duration::from_secs(15)).await;
            assert_eq!(object["status"], "failed", "{object}");
            assert_eq!(object["error"]["code"], "run_lost", "{object}");
            assert!(!output_text(&object).is_empty(), "{object}");
            assert_one_story(&r, id).await;
        }
        eventually(
            Duration::from_secs(10),
            "leases released",
            || r.logs(),
            || (r.leases_left().ok()? == 0).then_some(()),
        )
        .await;
    })
    .await;
}

/// A follower that loses the store mid-replay ends with an `error` event
/// whose number is the last one it showed, never one a real event takes:
/// a client that resumes after it, on another replica, misses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_loses_the_store_ends_where_a_resume_continues() {
    bounded(90, async {
        let r = Replicas::start(WorkerOpts::paced(0, 100), SHORT_LEASES).expect("replicas");
        let (a, b) = (r.a.client(), r.b.client());
        // The run belongs to B; A only follows it.
        let created = b
            .post_json(
                "/responses",
                &json!({"model": "base", "input": "synthetic:reply_tokens=300 go", "background": true}),
            )
            .await
            .expect("create");
        assert_eq!(created.status, 200, "{created}");
        let id = created.json()["id"].as_str().expect("an id").to_owned();
        let path = |after: Option<u64>| match after {
            Some(n) => format!("/responses/{id}?stream=true&starting_after={n}"),
            None => format!("/responses/{id}?stream=true"),
        };
        let mut live = a
            .open_stream(a.request(reqwest::Method::GET, &path(None)))
            .await
            .expect("follow on A");
        let mut seen: Vec<SseFrame> = Vec::new();
        let deltas = |frames: &[SseFrame]| {
            frames
                .iter()
                .filter(|f| f.event.as_deref() == Some("response.output_text.delta"))
                .count()
        };
        while deltas(&seen) < 5 {
            seen.push(live.next_frame().await.expect("a frame").expect("more"));
        }
        r.link_a.refuse(true);
        r.link_a.drop_connections();
        seen.extend(live.collect().await.expect("the rest of A's stream"));
        let last = seen.last().expect("an event");
        assert_eq!(last.event.as_deref(), Some("error"), "{seen:?}");
        let error_seq = last.json()["sequence_number"].as_u64().expect("a number");
        let shown_before = seen
            .iter()
            .rev()
            .nth(1)
            .and_then(|f| f.json()["sequence_number"].as_u64());
        assert_eq!(Some(error_seq), shown_before, "{seen:?}");

        let resumed = b
            .open_stream(b.request(reqwest::Method::GET, &path(Some(error_seq))))
            .await
            .expect("resume on B")
            .collect()
            .await
            .expect("B's stream");
        let events: Vec<(String, Value)> = seen
            .iter()
            .chain(resumed.iter())
            .filter(|f| f.event.as_deref() != Some("error"))
            .map(|f| (f.event.clone().unwrap_or_default(), f.json()))
            .collect();
        let told = streamed_text(events.iter().map(|(n, v)| (n.as_str(), v)));
        let stored = b.get(&format!("/responses/{id}")).await.expect("retrieve");
        let object = stored.json();
        assert_eq!(object["status"], "completed", "{object}");
        assert_eq!(told, output_text(&object), "resumed after the error's number");
    })
    .await
}
