//! Every request message a node decodes from the network (client, admin,
//! replica control, the Raft link's frames and snapshot chunks), decoded
//! from arbitrary bytes. What decodes must re-encode and decode to the same
//! message: prost never panics, loops or allocates unboundedly on input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tocsin_proto::v1 as pb;

fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(message) = M::decode(data) {
        let again = M::decode(message.encode_to_vec().as_slice()).expect("a re-encoded message decodes");
        assert_eq!(message, again);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, data)) = data.split_first() else { return };
    match which % 31 {
        0 => round_trip::<pb::CreateTimerRequest>(data),
        1 => round_trip::<pb::CreateTimersRequest>(data),
        2 => round_trip::<pb::GetTimerRequest>(data),
        3 => round_trip::<pb::ListTimersRequest>(data),
        4 => round_trip::<pb::CancelTimerRequest>(data),
        5 => round_trip::<pb::RescheduleTimerRequest>(data),
        6 => round_trip::<pb::ReserveRequest>(data),
        7 => round_trip::<pb::AckRequest>(data),
        8 => round_trip::<pb::NackRequest>(data),
        9 => round_trip::<pb::GetHorizonRequest>(data),
        10 => round_trip::<pb::GetClusterRequest>(data),
        11 => round_trip::<pb::GetShardMapRequest>(data),
        12 => round_trip::<pb::AddNodeRequest>(data),
        13 => round_trip::<pb::RemoveNodeRequest>(data),
        14 => round_trip::<pb::DecommissionNodeRequest>(data),
        15 => round_trip::<pb::MoveShardRequest>(data),
        16 => round_trip::<pb::TransferLeaderRequest>(data),
        17 => round_trip::<pb::RebalanceRequest>(data),
        18 => round_trip::<pb::RaftLinkFrame>(data),
        19 => round_trip::<pb::SnapshotChunk>(data),
        20 => round_trip::<pb::HostShardRequest>(data),
        21 => round_trip::<pb::ReleaseShardRequest>(data),
        22 => round_trip::<pb::ProposeClusterRequest>(data),
        23 => round_trip::<pb::ReadClusterMapRequest>(data),
        24 => round_trip::<pb::CreateTokenRequest>(data),
        25 => round_trip::<pb::ListTokensRequest>(data),
        26 => round_trip::<pb::RevokeTokenRequest>(data),
        27 => round_trip::<pb::SetNamespaceQuotaRequest>(data),
        28 => round_trip::<pb::ListNamespaceQuotasRequest>(data),
        29 => round_trip::<pb::SetNamespaceSecretRequest>(data),
        _ => round_trip::<pb::ListNamespaceSecretsRequest>(data),
    }
});
