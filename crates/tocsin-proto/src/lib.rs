//! The code generated from `proto/tocsin/v1/`: messages, clients and servers
//! for the public `TimerService`, the internal `RaftTransport` and the
//! `AdminService`.
//!
//! Generation runs in `build.rs` with protox (pure Rust), so building needs no
//! `protoc`. Everything lives in [`v1`]; [`FILE_DESCRIPTOR_SET`] holds the
//! encoded descriptors for reflection and tests.

#![allow(missing_docs)]

/// `package tocsin.v1`.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("tocsin.v1");
}

/// The encoded `FileDescriptorSet` of every `.proto` file.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("tocsin_descriptor");
