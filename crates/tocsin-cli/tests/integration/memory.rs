//! The node process's memory settings, read from the kernel: transparent
//! huge pages are off (`main.rs`'s `no_transparent_huge_pages`), unless
//! the operator sets `MIMALLOC_ALLOW_THP`, which mimalloc then follows.

use crate::support::NodeProcess;

/// `THP_enabled` in `/proc/<pid>/status`: whether the kernel may back the
/// process's memory with transparent huge pages.
fn thp_enabled(node: &NodeProcess) -> Option<bool> {
    let pid = node.pid().expect("the node runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the node's status");
    status.lines().find_map(|l| l.strip_prefix("THP_enabled:")).map(|v| v.trim() == "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_without_transparent_huge_pages_unless_mimalloc_is_told_otherwise() {
    // Phase: a node as started by default.
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let Some(enabled) = thp_enabled(&node) else {
        // A kernel before 5.0 does not say; nothing to check there.
        println!("THP_enabled is not in /proc/<pid>/status on this kernel");
        return;
    };
    assert!(!enabled, "the node runs with transparent huge pages on");
    drop(node);

    // Phase: the operator's MIMALLOC_ALLOW_THP=1 leaves them on.
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[("MIMALLOC_ALLOW_THP", "1")]);
    assert_eq!(thp_enabled(&node), Some(true), "MIMALLOC_ALLOW_THP=1 is not followed");
}
