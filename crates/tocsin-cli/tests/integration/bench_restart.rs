//! `tocsin bench restart` on a fresh machine: the bench starts its own
//! `tocsin serve` node, preloads timers, creates marker timers that call
//! its own sink on 127.0.0.1, kills the node with SIGKILL and restarts it.
//! Since bearer tokens and the webhook SSRF guard, such a node refused the
//! bench's calls and its markers unless told otherwise; the bench now
//! starts its node open and allowing its loopback sink. This runs it small
//! (2,000 pending) and checks that every marker survived the kill and was
//! delivered, and that the figures it exists for were printed.

use std::process::Command;

#[test]
fn bench_restart_runs_against_the_node_it_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin"))
        .args(["bench", "restart", "--pending", "2000", "--batch", "500", "--concurrency", "4", "--quiet", "--data"])
        .arg(dir.path().join("node"))
        // Whatever the calling shell holds, the bench's node must not
        // depend on it.
        .env_remove("TOCSIN_AUTH__MODE")
        .env_remove("TOCSIN_DELIVERY__WEBHOOK_ALLOW")
        .output()
        .expect("run tocsin bench restart");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench restart failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert!(stdout.contains("pending timers: 2000;"), "no RSS line with 2,000 pending:\n{stdout}");
    assert!(stdout.contains("100 of 100 markers delivered"), "markers lost across the kill:\n{stdout}");
}
