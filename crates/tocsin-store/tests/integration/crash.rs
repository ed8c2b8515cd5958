//! Crash durability: a child process appends to the log in a tight loop and
//! reports each append the moment its durability callback fires; the parent
//! kills it with SIGKILL mid-stream, reopens the database, and checks every
//! reported append (and the last reported vote) is there.
//!
//! A SIGKILL keeps the kernel's page cache, so this proves "acknowledged
//! means written to the WAL before the ack", not survival of a power cut;
//! the WAL sync before each ack is what covers that case (docs/storage.md).

use std::io::BufRead;
use std::io::BufReader;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use openraft::RaftLogReader;
use openraft::storage::RaftLogStorage;
use tocsin_core::Proposal;
use tocsin_store::LogStore;
use tocsin_store::Store;
use tocsin_store::StoreConfig;

use crate::support;

const CHILD_ENV: &str = "TOCSIN_CRASH_CHILD_DIR";

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
                        .map(|i| support::entry(1, i, Proposal { now_ms: i, commands: vec![] }))
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
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash::crash_child_entry_point", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acked = [0u64; 3];
            let mut votes = [0u64; 3];
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let parts: Vec<&str> = line.split_whitespace().collect();
                match parts.as_slice() {
                    ["acked", g, i] => acked[g.parse::<usize>().unwrap()] = i.parse().unwrap(),
                    ["vote", g, t] => votes[g.parse::<usize>().unwrap()] = t.parse().unwrap(),
                    _ => {}
                }
            }
            (acked, votes)
        });
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(700 + 300 * round));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let (acked, votes) = reader.join().unwrap();
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
