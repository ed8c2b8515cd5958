//! Crash durability: a child process appends to the log in a tight loop and
//! reports each append the moment its durability callback fires; the parent
//! kills it with SIGKILL mid-stream, reopens the database, and checks every
//! reported append (and the last reported vote) is there.
//!
//! A second child also applies each batch after appending it, the way
//! openraft does, and apply does not wait for its own WAL sync
//! (docs/storage.md). After the kill the state machine must hold exactly
//! the state of a prefix of the log, never part of a batch, and applying the
//! rest of the log must give what a clean store gives from the same log.
//!
//! A SIGKILL keeps the kernel's page cache, so this proves "acknowledged
//! means written to the WAL before the ack", not survival of a power cut;
//! the WAL sync before each ack is what covers that case (docs/storage.md).

use std::io::BufRead;
use std::io::BufReader;
use std::process::Command as Process;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use openraft::RaftLogReader;
use openraft::storage::RaftLogStorage;
use tocsin_core::Command;
use tocsin_core::Proposal;
use tocsin_core::TimerKey;
use tocsin_core::TimerSpec;
use tocsin_core::timer::Callback;
use tocsin_core::timer::FireTime;
use tocsin_core::timer::RetryPolicy;
use tocsin_store::Entry;
use tocsin_store::LogStore;
use tocsin_store::StateMachine;
use tocsin_store::Store;
use tocsin_store::StoreConfig;

use crate::support;

const CHILD_ENV: &str = "TOCSIN_CRASH_CHILD_DIR";
const APPLY_CHILD_ENV: &str = "TOCSIN_CRASH_APPLY_CHILD_DIR";

/// Not a test of its own: the body of the child process, which the parent
/// starts by running this test binary filtered to this name with
/// `TOCSIN_CRASH_CHILD_DIR` set. Without the variable it returns at once.
#[test]
fn crash_child_entry_point() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let store = Store::open(&StoreConfig::new(&dir)).unwrap();
        // Two groups append concurrently, so one fsync covers both.
        let mut tasks = Vec::new();
        for group in [1u64, 2] {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut log = LogStore::new(store, group);
                let mut index = 1u64;
                let mut term = 1u64;
                loop {
                    let batch = 1 + (index % 7);
                    let entries = (index..index + batch)
                        .map(|i| support::entry(1, i, Proposal { now_ms: i, commands: Vec::new().into() }))
                        .collect();
                    support::append(&mut log, entries).await;
                    index += batch;
                    println!("acked {group} {}", index - 1);
                    if index % 50 < batch {
                        term += 1;
                        let vote = openraft::Vote::new(term, group);
                        log.save_vote(&vote).await.unwrap();
                        println!("vote {group} {term}");
                    }
                }
            }));
        }
        // The writers loop until the parent kills this process.
        futures::future::join_all(tasks).await;
    });
}

#[test]
fn acknowledged_appends_survive_sigkill() {
    let base = tempfile::tempdir().unwrap();
    for round in 0..3u64 {
        // Each round starts a fresh log in its own directory.
        let dir = base.path().join(format!("round-{round}"));
        // Phase: run the writer child and kill it with SIGKILL mid-stream.
        let started = Instant::now();
        let lines = run_child_then_kill(
            "crash::crash_child_entry_point",
            CHILD_ENV,
            &dir,
            Duration::from_millis(700 + 300 * round),
        );
        let (mut acked, mut votes) = ([0u64; 3], [0u64; 3]);
        for line in &lines {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["acked", g, i] => acked[g.parse::<usize>().unwrap()] = i.parse().unwrap(),
                ["vote", g, t] => votes[g.parse::<usize>().unwrap()] = t.parse().unwrap(),
                _ => {}
            }
        }
        assert!(acked[1] > 0 && acked[2] > 0, "the child made progress in {:?}", started.elapsed());

        // Phase: reopen and find every acknowledged entry and the last vote.
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let store = Store::open(&StoreConfig::new(&dir)).unwrap();
            for group in [1u64, 2] {
                let mut log = LogStore::new(store.clone(), group);
                let state = log.get_log_state().await.unwrap();
                let last = state.last_log_id.map_or(0, |id| id.index);
                assert!(
                    last >= acked[group as usize],
                    "group {group}: acked {} but the log ends at {last}",
                    acked[group as usize]
                );
                let entries = log.try_get_log_entries(1..=acked[group as usize]).await.unwrap();
                assert_eq!(
                    entries.len() as u64,
                    acked[group as usize],
                    "group {group}: a hole in acknowledged entries"
                );
                let vote = log.read_vote().await.unwrap();
                let term = vote.map_or(0, |v| v.leader_id().term);
                assert!(
                    term >= votes[group as usize],
                    "group {group}: vote {} lost, have {term}",
                    votes[group as usize]
                );
                println!(
                    "round {round} group {group}: {} acked entries and vote {} present",
                    acked[group as usize], votes[group as usize]
                );
            }
        });
    }
}

/// Runs this test binary as a child, filtered to the test `entry` with
/// `env` set to `dir`, for `run_for`; then kills it with SIGKILL and returns
/// every line it printed.
fn run_child_then_kill(entry: &str, env: &str, dir: &std::path::Path, run_for: Duration) -> Vec<String> {
    let mut child = Process::new(std::env::current_exe().unwrap())
        .args(["--exact", entry, "--nocapture", "--test-threads=1"])
        .env(env, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>());
    std::thread::sleep(run_for);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap()
}

/// The entry at log index `index` of the apply child's log: a create, every
/// fourth one also cancelling the timer before it, the first one also
/// stamping the leader epoch.
fn apply_child_entry(index: u64) -> Entry {
    let now_ms = 1_800_000_000_000 + index * 10;
    let mut commands = vec![Command::Create {
        key: TimerKey::new("orders", format!("t-{index}")),
        spec: Box::new(TimerSpec {
            fire_time: FireTime::At(now_ms + 60_000),
            payload: vec![7; 64].into(),
            labels: Default::default(),
            callback: Callback::Webhook { url: "http://127.0.0.1:1/h".into() },
            retry: RetryPolicy::default(),
            skip_if_late_ms: 0,
            recurrence: None,
        }),
        fire_at_ms: now_ms + 60_000,
        retry: RetryPolicy::default(),
        retention_ms: 60_000,
        replace_finished: false,
    }];
    if index == 1 {
        commands.insert(0, Command::LeaderEpoch { leader: 1 });
    }
    if index.is_multiple_of(4) {
        commands.push(Command::Cancel { key: TimerKey::new("orders", format!("t-{}", index - 1)) });
    }
    support::entry(1, index, Proposal { now_ms, commands: commands.into() })
}

/// Not a test of its own: the apply child (see the module note). Without
/// `TOCSIN_CRASH_APPLY_CHILD_DIR` it returns at once.
#[test]
fn crash_apply_child_entry_point() {
    let Ok(dir) = std::env::var(APPLY_CHILD_ENV) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let store = Store::open(&StoreConfig::new(&dir)).unwrap();
        let mut log = LogStore::new(store.clone(), 1);
        let sm = StateMachine::open(store, 1).await.unwrap();
        let mut index = 1u64;
        loop {
            let batch = 1 + (index % 5);
            let entries: Vec<Entry> = (index..index + batch).map(apply_child_entry).collect();
            support::append(&mut log, entries.clone()).await;
            support::apply(&sm, entries).await;
            index += batch;
            println!("applied {}", index - 1);
        }
    });
}

#[test]
fn apply_after_sigkill_is_a_prefix_of_the_log_and_replays_to_the_same_state() {
    let base = tempfile::tempdir().unwrap();
    for round in 0..3u64 {
        let dir = base.path().join(format!("apply-round-{round}"));
        // Phase: run the apply child and kill it with SIGKILL mid-stream.
        let lines = run_child_then_kill(
            "crash::crash_apply_child_entry_point",
            APPLY_CHILD_ENV,
            &dir,
            Duration::from_millis(700 + 300 * round),
        );
        let reported = lines.iter().rev().find_map(|l| l.strip_prefix("applied ")).map_or(0, |i| i.parse().unwrap());
        assert!(reported > 0, "the apply child made progress");

        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            // Phase: reopen; the applied state is a prefix of the durable log.
            let store = Store::open(&StoreConfig::new(&dir)).unwrap();
            let mut log = LogStore::new(store.clone(), 1);
            let mut sm = StateMachine::open(store.clone(), 1).await.unwrap();
            let last = log.get_log_state().await.unwrap().last_log_id.map_or(0, |id| id.index);
            let applied = support::applied(&mut sm).await.map_or(0, |id| id.index);
            assert!(last >= reported, "round {round}: {reported} applied (so logged) but the log ends at {last}");
            assert!(applied <= last, "round {round}: applied {applied} is past the log's end {last}");
            let entries = log.try_get_log_entries(1..=last).await.unwrap();
            assert_eq!(entries.len() as u64, last, "round {round}: a hole in the log");

            // Phase: a clean store given the same log up to `applied` has the
            // same state: no batch was half applied.
            let (_clean_dir, clean) = support::open_store();
            let clean_sm = StateMachine::open(clean.clone(), 1).await.unwrap();
            support::apply(&clean_sm, entries[..applied as usize].to_vec()).await;
            assert_eq!(
                store.state_digest(1).unwrap(),
                clean.state_digest(1).unwrap(),
                "round {round}: the state after the crash is not the state at applied index {applied}"
            );

            // Phase: openraft applies the rest again from the log; both agree.
            support::apply(&sm, entries[applied as usize..].to_vec()).await;
            support::apply(&clean_sm, entries[applied as usize..].to_vec()).await;
            let (after, expected) = (store.state_digest(1).unwrap(), clean.state_digest(1).unwrap());
            assert_eq!(after, expected, "round {round}: replaying the log after the crash diverged");
            assert_eq!(after.applied_index, last);
            println!(
                "round {round}: {reported} applied before the kill, {applied} found applied, log ends at {last}; \
                 {} timers after replay",
                after.timer_count
            );
        });
    }
}
