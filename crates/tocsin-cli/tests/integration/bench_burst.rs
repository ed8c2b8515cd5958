//! `tocsin bench burst`, the thundering second the side-by-side script
//! runs at 200,000 and 1,000,000 timers, run small against a real node:
//! 2,000 timers due in one second, once as pull timers drained by the
//! bench's consumer and once (`--webhook`) as webhook timers the bench's
//! embedded sink receives. Each must report every timer delivered, none
//! early, and exit with success only then.

use std::process::Command;

use crate::support::NodeProcess;

fn burst(grpc: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["bench", "burst", "--addr", grpc, "--count", "2000", "--lead-ms", "1000", "--quiet"])
        .args(extra)
        .output()
        .expect("run tocsin bench burst");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench burst {extra:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout
}

#[test]
fn bench_burst_delivers_every_pull_and_webhook_timer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = NodeProcess::start(dir.path(), &[]);

    let pull = burst(&node.grpc, &["--run", "pull"]);
    assert!(pull.contains("created 2000 pull timers"), "{pull}");
    assert!(pull.contains("2000 of 2000 delivered;") && pull.contains("early 0;"), "{pull}");

    let webhook = burst(&node.grpc, &["--run", "hook", "--webhook"]);
    assert!(webhook.contains("created 2000 webhook timers"), "{webhook}");
    assert!(webhook.contains("2000 of 2000 delivered;") && webhook.contains("early 0;"), "{webhook}");
    assert!(webhook.contains("stale rejected 0"), "{webhook}");
}
