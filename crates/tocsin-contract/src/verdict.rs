//! What a receiver decided about one delivery, as `tocsin sink` and the
//! chaos tests' pull consumer write it (one NDJSON line each) and as the
//! chaos checker and the benchmarks count it. An enum, so that a renamed
//! verdict fails to compile or to parse instead of silently counting zero.

use serde::Deserialize;
use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Fresh epoch, first time this fire id was seen: the side effect ran.
    #[default]
    Accepted,
    /// A fire id seen before: answered 200, no side effect.
    Duplicate,
    /// An epoch below the largest seen for the shard: answered 409.
    RejectedStale,
    /// A missing, wrong or expired signature: answered 401.
    RejectedSig,
    /// A body that is not a delivery: answered 400.
    BadBody,
    /// The sink's mode answered an error status without deciding.
    Refused,
    /// A slow path's request arrived; its decision follows in another line.
    Slow,
    /// A pull consumer reserved the delivery and let it go unacked.
    Abandoned,
    /// A pull consumer's ack: the reservation was superseded (stale epoch
    /// or attempt).
    AckStale,
    /// A pull consumer's ack: the node knew no such reservation.
    AckNotFound,
    /// A pull consumer's ack call failed; the outcome is unknown.
    AckFailed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Accepted => "accepted",
            Verdict::Duplicate => "duplicate",
            Verdict::RejectedStale => "rejected_stale",
            Verdict::RejectedSig => "rejected_sig",
            Verdict::BadBody => "bad_body",
            Verdict::Refused => "refused",
            Verdict::Slow => "slow",
            Verdict::Abandoned => "abandoned",
            Verdict::AckStale => "ack_stale",
            Verdict::AckNotFound => "ack_not_found",
            Verdict::AckFailed => "ack_failed",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_names_are_the_display_names() {
        for v in [
            Verdict::Accepted,
            Verdict::Duplicate,
            Verdict::RejectedStale,
            Verdict::RejectedSig,
            Verdict::BadBody,
            Verdict::Refused,
            Verdict::Slow,
            Verdict::Abandoned,
            Verdict::AckStale,
            Verdict::AckNotFound,
            Verdict::AckFailed,
        ] {
            assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{v}\""));
            assert_eq!(serde_json::from_str::<Verdict>(&format!("\"{v}\"")).unwrap(), v);
        }
        assert!(serde_json::from_str::<Verdict>("\"accept\"").is_err());
    }
}
