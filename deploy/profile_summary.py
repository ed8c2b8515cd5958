#!/usr/bin/env python3
"""Summarises folded stacks (deploy/profile.sh writes them): the share of
samples per thread, per kind of work, and the frames with the largest
inclusive and self shares.

usage: profile_summary.py folded.txt
"""

import collections, re, sys
# Frames every stack has (threads, the async runtime, closures, unwinding)
# say nothing about where the time went: left out of the inclusive list.
GENERIC = re.compile(
    r"^(std::|core::|alloc::|tokio::runtime::|start_thread|__clone|<>::new::thread_start|\[unknown\]"
    r"|<alloc::|poll<>|poll2<>|<>::poll$|\{async_|\{closure|call_once|catch_unwind|do_call|with_mut|poll_inner"
    r"|poll_future|__rust_begin|entry_SYSCALL|do_syscall_64|schedule$|set$|enter_runtime|run$|block_on)"
)
# What kind of work a sample is, by the innermost frame that says so.
KINDS = [
    ("kernel: context switches and wake-ups", r"finish_task_switch|try_to_wake_up|_raw_spin_unlock|^schedule"),
    ("kernel: fsync and block I/O", r"fsync|fdatasync|blk_|iowrite|virtqueue|ext4_sync"),
    ("kernel: sockets", r"tcp_|sock_|__sys_sendto|__sys_recvfrom|inet_|^ip_"),
    ("RocksDB", r"^rocksdb::|^rocksdb_"),
    ("allocation", r"^_?mi_|malloc|^free$|realloc"),
    ("copies", r"memcpy|memmove"),
    ("protobuf (prost)", r"prost::"),
    ("HTTP/2 (h2, hyper, tonic)", r"^h2::|hyper::|tonic::"),
    ("openraft", r"openraft::"),
    ("postcard (entries, records)", r"postcard::"),
]
total, threads = 0, collections.Counter()
inclusive, self_, kinds = collections.Counter(), collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    stack, n = line.rsplit(" ", 1)
    n = int(n)
    frames = stack.split(";")
    total += n
    threads[frames[0]] += n
    # Generic parameters make one function many frames: strip them.
    names = [re.sub(r"<[^;]*>", "<>", f) for f in frames[1:]]
    for name in set(names):
        if not GENERIC.search(name):
            inclusive[name] += n
    if names:
        self_[names[-1]] += n
    kind = "other"
    for name in reversed(names):
        hit = next((k for k, pat in KINDS if re.search(pat, name)), None)
        if hit:
            kind = hit
            break
    kinds[kind] += n
total = max(total, 1)
print(f"{total} samples")
print("\n== threads (share of samples)")
for name, n in threads.most_common(12):
    print(f"{100 * n / total:5.1f}%  {name}")
print("\n== kinds of work (by the innermost frame that names one)")
for name, n in kinds.most_common():
    print(f"{100 * n / total:5.1f}%  {name}")
print("\n== frames, inclusive (share of samples with the frame on the stack; runtime frames left out)")
for name, n in inclusive.most_common(45):
    print(f"{100 * n / total:5.1f}%  {name[:150]}")
print("\n== frames, self (share of samples in the frame itself)")
for name, n in self_.most_common(25):
    print(f"{100 * n / total:5.1f}%  {name[:150]}")
