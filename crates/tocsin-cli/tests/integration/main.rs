//! End-to-end tests of the `tocsin` binary: real processes, real sockets,
//! real RocksDB. One binary, one module per scenario.

mod amqp;
mod auth;
mod bad_input;
mod bench_burst;
mod bench_restart;
mod client_tls;
mod clock;
mod cluster_id;
mod cluster_ops;
mod coalesce;
mod console;
mod egress;
mod failure_path;
mod faults;
mod grpc_conventions;
mod lifecycle;
mod logging;
mod memory;
mod openapi;
mod peer_port;
mod peer_tls;
mod pull;
mod quotas;
mod recurring;
mod routing;
mod signing;
mod support;
mod webhook;
