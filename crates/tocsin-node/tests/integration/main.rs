//! `tocsin-node`'s own tests: nodes started in this test process
//! ([`cluster::Cluster`], real RocksDB and real loopback sockets, no
//! binaries), so forwarding, admission, proposer batching and the fire loop
//! are tested at the crate that implements them.

mod armed;
mod cluster;
mod in_process;
mod quiet;
