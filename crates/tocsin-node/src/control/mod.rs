//! The control plane: the metadata group and the cluster map it replicates
//! ([`meta`]), the shared node state ([`state`]) and what this node reports
//! about itself ([`report`]), the cluster as the nodes report it ([`view`]),
//! moving replicas to where the map says ([`reconcile`], [`replicas`]), the
//! operations behind `tocsin admin` ([`ops`]), and spreading leaderships
//! ([`balance`]). It uses the shard layer and is used by the API layer,
//! never the other way round.

pub mod balance;
pub mod map;
pub mod meta;
pub mod ops;
pub mod reconcile;
pub mod replicas;
pub mod report;
pub mod state;
pub mod view;
