//! The scenarios, one module each, and [`all`], which lists them in the
//! order a full run takes them: the baseline, the process and network
//! faults, the membership operations, then the rows added since (receivers,
//! pull consumers, clocks, disks, flapping and one-way networks, snapshot
//! catch-up). `clock` and `disk_fill` hold what two or three of them share.

mod add_node;
mod baseline;
mod clock;
mod clock_back;
mod clock_forward;
mod clock_skewed_leader;
mod disk_fill;
mod disk_full_follower;
mod disk_full_leader;
mod flapping_partitions;
mod freeze_leader;
mod kill_all;
mod kill_during_change;
mod kill_leader;
mod one_way_drop;
mod partition_leader;
mod pull_consumer_crash;
mod rebalance;
mod receiver_down;
mod receiver_failing;
mod remove_node;
mod rolling_restart;
mod slow_disk;
mod snapshot_catchup_kill;

use crate::scenario::Scenario;

/// Every scenario, in run order.
pub fn all() -> Vec<Box<dyn Scenario>> {
    vec![
        Box::new(baseline::Baseline),
        Box::new(kill_leader::KillLeader),
        Box::new(partition_leader::PartitionLeader),
        Box::new(freeze_leader::FreezeLeader),
        Box::new(kill_all::KillAll),
        Box::new(rolling_restart::RollingRestart),
        Box::new(add_node::AddNode),
        Box::new(remove_node::RemoveNode),
        Box::new(kill_during_change::KillDuringChange),
        Box::new(rebalance::Rebalance),
        Box::new(receiver_down::ReceiverDown),
        Box::new(receiver_failing::ReceiverFailing),
        Box::new(pull_consumer_crash::PullConsumerCrash),
        Box::new(clock_forward::ClockForward),
        Box::new(clock_back::ClockBack),
        Box::new(clock_skewed_leader::ClockSkewedLeader),
        Box::new(disk_full_leader::DiskFullLeader),
        Box::new(disk_full_follower::DiskFullFollower),
        Box::new(slow_disk::SlowDisk),
        Box::new(flapping_partitions::FlappingPartitions),
        Box::new(one_way_drop::OneWayDrop),
        Box::new(snapshot_catchup_kill::SnapshotCatchupKill),
    ]
}
