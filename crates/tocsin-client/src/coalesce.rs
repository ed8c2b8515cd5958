//! Coalescing: concurrent single creates bound for the same node leave in
//! one `CreateTimers` call.
//!
//! Why: a unary gRPC call costs both ends far more than the create it
//! carries. Measured on the project's 2-core machine (2026-11-27, one node,
//! `tocsin bench create --concurrency 64`): the node spent about 104 µs of
//! CPU per single create and the client 41 µs, against 26 µs and 8.5 µs per
//! create sent 100 to a `CreateTimers` call; most of the difference is
//! HTTP/2 streams, tasks and syscalls per call, on both sides. So the
//! client does what TiKV's client (batch commands) and the Pub/Sub and SQS
//! clients do: callers that find their node busy share a call.
//!
//! **No added latency.** There is no timer and no linger: a create whose
//! node has fewer than `coalesce_in_flight` calls out leaves at once, in a
//! call of its own (its future drives it). Only while that many calls are
//! out do new creates queue, and each call that comes back takes what
//! queued meanwhile. At concurrency 1 every create is its own call, as
//! before.
//!
//! **Same answers as `CreateTimer`.** Each caller gets its own item's
//! result. An item's definite answer (created, `ALREADY_EXISTS`, an invalid
//! field, ...) is final, as it would be from `CreateTimer`; an item refused
//! for a retryable reason (a leader change, a shard shedding load) is
//! retried by its caller after the hint's wait, through the lane again. A
//! call that fails as a whole (no answer, a transport error, a refusal of
//! the whole batch such as a token not valid for another caller's
//! namespace) answers nobody: every caller in it goes on by the
//! single-create path, which retries by its own rules, so a batch never
//! turns one caller's problem into another's error.
//!
//! **Admission is per create.** A node admits a `CreateTimers` call's items
//! of one namespace together (its rate buckets, quotas and load shedding
//! take or refuse them as a group), so a create refused with
//! `RESOURCE_EXHAUSTED` in a shared call is asked again alone, by the
//! single-create path, where it is weighed on its own: a burst of single
//! creates under a rate quota is admitted up to the quota, as it would be
//! without coalescing.
//!
//! **Bounded.** At most [`MAX_CALL_ITEMS`] items and [`MAX_CALL_BYTES`] of
//! payload per call, `coalesce_in_flight` calls per node, and at most
//! `coalesce_in_flight` × [`MAX_CALL_ITEMS`] creates queued behind them:
//! past that a create takes the single path at once, so a node that falls
//! behind sees the load offered (and sheds it, with its retry hints)
//! instead of a client-side queue growing in front of it.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;

use tocsin_proto::v1 as pb;
use tocsin_proto::v1::timer_service_client::TimerServiceClient;
use tokio::sync::oneshot;

use crate::Client;
use crate::ClientError;

/// Most items in one coalesced call (well under the server's batch limit,
/// 1,000 by default).
pub(crate) const MAX_CALL_ITEMS: usize = 256;
/// Most payload bytes in one coalesced call (the server decodes up to 64 MiB).
pub(crate) const MAX_CALL_BYTES: usize = 4 << 20;

/// What a coalesced create came back with.
#[derive(Debug)]
pub(crate) enum LaneOutcome {
    /// The call was answered: this is the item's own result (boxed: it is
    /// moved through a channel per caller).
    Item(Box<Result<pb::CreateTimerResponse, ClientError>>),
    /// The call failed as a whole; the item's outcome is unknown.
    CallFailed,
    /// The lane's queue is full; nothing was sent.
    Full,
}

/// One node's lane.
#[derive(Default)]
pub(crate) struct Lane {
    state: Mutex<LaneState>,
}

#[derive(Default)]
struct LaneState {
    queue: VecDeque<Waiting>,
    /// Calls out, counting a driver between two calls.
    in_flight: usize,
}

struct Waiting {
    req: pb::CreateTimerRequest,
    done: oneshot::Sender<LaneOutcome>,
}

/// Every node's lane, by gRPC address.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<String, Arc<Lane>>>,
}

impl Lanes {
    pub(crate) fn lane(&self, addr: &str) -> Arc<Lane> {
        let mut lanes = self.lanes.lock().expect("lanes lock");
        if let Some(lane) = lanes.get(addr) {
            return lane.clone();
        }
        let lane = Arc::new(Lane::default());
        lanes.insert(addr.to_string(), lane.clone());
        lane
    }
}

/// Takes the next call's items off the queue: FIFO, within the bounds.
fn take_call(queue: &mut VecDeque<Waiting>) -> Vec<Waiting> {
    let mut bytes = 0usize;
    let mut call = Vec::new();
    while let Some(next) = queue.front() {
        let size = next.req.payload.len() + 256;
        if !call.is_empty() && (call.len() >= MAX_CALL_ITEMS || bytes + size > MAX_CALL_BYTES) {
            break;
        }
        bytes += size;
        call.extend(queue.pop_front());
    }
    call
}

/// Whether a new caller may start a call on a lane that has `in_flight`
/// calls out, against the bound `max_in_flight`.
fn may_start(in_flight: usize, max_in_flight: usize) -> bool {
    in_flight < max_in_flight.max(1)
}

/// The most creates a lane holds queued behind `max_in_flight` calls.
fn max_queued(max_in_flight: usize) -> usize {
    max_in_flight.max(1) * MAX_CALL_ITEMS
}

/// Holds one of the lane's in-flight slots. Dropped, it hands the slot on:
/// to a spawned driver if callers are queued, else back to the lane. So a
/// caller whose future is dropped mid-call (a timeout around it) strands
/// nobody queued behind it.
struct Slot {
    lane: Arc<Lane>,
    client: Client,
    addr: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let queued = {
            let mut state = self.lane.state.lock().expect("lane lock");
            if state.queue.is_empty() {
                state.in_flight -= 1;
                false
            } else {
                true
            }
        };
        if queued {
            let (lane, client, addr) = (self.lane.clone(), self.client.clone(), std::mem::take(&mut self.addr));
            tokio::spawn(async move { Slot { lane, client, addr }.drive().await });
        }
    }
}

impl Slot {
    /// Sends the queue's head as one call and answers its callers.
    async fn one_call(&self) {
        let call = take_call(&mut self.lane.state.lock().expect("lane lock").queue);
        if call.is_empty() {
            return;
        }
        let (reqs, waiters): (Vec<pb::CreateTimerRequest>, Vec<oneshot::Sender<LaneOutcome>>) =
            call.into_iter().map(|w| (w.req, w.done)).unzip();
        match self.client.create_timers_at(&self.addr, reqs).await {
            Ok(results) if results.len() == waiters.len() => {
                for (waiter, result) in waiters.into_iter().zip(results) {
                    let _ = waiter.send(LaneOutcome::Item(Box::new(result)));
                }
            }
            // A node that answers another count than it was asked, or no
            // answer: the callers' single path finds out what happened.
            _ => {
                for waiter in waiters {
                    let _ = waiter.send(LaneOutcome::CallFailed);
                }
            }
        }
    }

    /// Sends calls until the queue is empty; the slot goes back on drop.
    async fn drive(self) {
        while !self.lane.state.lock().expect("lane lock").queue.is_empty() {
            self.one_call().await;
        }
    }
}

impl Client {
    /// Creates `req` through the lane of the node at `addr` (see the module
    /// doc).
    pub(crate) async fn create_coalesced(&self, addr: &str, req: pb::CreateTimerRequest) -> LaneOutcome {
        let lane = self.inner.lanes.lane(addr);
        let (done, rx) = oneshot::channel();
        let max_in_flight = self.inner.options.coalesce_in_flight;
        let lead = {
            let mut state = lane.state.lock().expect("lane lock");
            if state.queue.len() >= max_queued(max_in_flight) {
                return LaneOutcome::Full;
            }
            state.queue.push_back(Waiting { req, done });
            let lead = may_start(state.in_flight, max_in_flight);
            if lead {
                state.in_flight += 1;
            }
            lead
        };
        if lead {
            // This caller's future sends the call its item is in (with
            // whatever queued before it); later callers' items go with the
            // next call, sent by whoever holds the slot then.
            let slot = Slot { lane, client: self.clone(), addr: addr.to_string() };
            slot.one_call().await;
        }
        rx.await.unwrap_or(LaneOutcome::CallFailed)
    }

    /// One `CreateTimers` call to the node at `addr`, one attempt: each
    /// item's result, or the call's own failure.
    pub(crate) async fn create_timers_at(
        &self,
        addr: &str,
        timers: Vec<pb::CreateTimerRequest>,
    ) -> Result<Vec<Result<pb::CreateTimerResponse, ClientError>>, ClientError> {
        let channel = self.channel(addr)?;
        let mut client = TimerServiceClient::new(channel).max_decoding_message_size(64 << 20);
        let shards: std::collections::BTreeSet<u32> =
            timers.iter().map(|t| self.shard_of(&t.namespace, &t.id)).collect();
        let call = client.create_timers(self.routed(pb::CreateTimersRequest { timers }));
        let resp = match tokio::time::timeout(self.inner.options.request_timeout, call).await {
            Ok(Ok(resp)) => {
                // The node forwarded items to one leader: the map is stale.
                // A call of one shard's items says which shard moved there;
                // otherwise the map is refreshed (at most every 200 ms,
                // however many calls find it stale), off the callers' path.
                if let Some(leader) = crate::retry::forwarded_to(resp.metadata()) {
                    match shards.iter().collect::<Vec<_>>().as_slice() {
                        [shard] => self.learned_leader(Some(**shard), leader),
                        _ => {
                            let client = self.clone();
                            tokio::spawn(async move { client.refresh_after_failure().await });
                        }
                    }
                }
                resp.into_inner()
            }
            Ok(Err(status)) => return Err(ClientError::from_status(status)),
            Err(_) => {
                self.suspect(addr);
                return Err(self.no_answer(addr));
            }
        };
        Ok(resp.results.into_iter().map(crate::calls::item_result).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(payload: usize) -> (Waiting, oneshot::Receiver<LaneOutcome>) {
        let (done, rx) = oneshot::channel();
        let req = pb::CreateTimerRequest { payload: vec![0u8; payload].into(), ..Default::default() };
        (Waiting { req, done }, rx)
    }

    #[test]
    fn a_call_takes_the_queue_in_order_within_its_item_bound() {
        let mut queue: VecDeque<Waiting> = (0..MAX_CALL_ITEMS + 3).map(|_| waiting(10).0).collect();
        assert_eq!(take_call(&mut queue).len(), MAX_CALL_ITEMS);
        assert_eq!(take_call(&mut queue).len(), 3);
        assert!(take_call(&mut queue).is_empty());
    }

    #[test]
    fn a_call_stops_at_its_byte_bound_but_always_takes_one() {
        let big = MAX_CALL_BYTES / 2;
        let mut queue: VecDeque<Waiting> = (0..3).map(|_| waiting(big).0).collect();
        // Two halves plus their overhead exceed the bound: one per call.
        assert_eq!(take_call(&mut queue).len(), 1);
        let mut huge: VecDeque<Waiting> = std::iter::once(waiting(2 * MAX_CALL_BYTES).0).collect();
        assert_eq!(take_call(&mut huge).len(), 1, "an item over the bound still leaves, alone");
    }

    #[test]
    fn the_queue_holds_at_most_a_call_per_slot() {
        assert_eq!(max_queued(4), 4 * MAX_CALL_ITEMS);
        assert_eq!(max_queued(0), MAX_CALL_ITEMS);
    }

    #[test]
    fn callers_start_calls_up_to_the_bound_and_zero_means_one() {
        assert!(may_start(0, 4));
        assert!(may_start(3, 4));
        assert!(!may_start(4, 4));
        assert!(may_start(0, 0));
        assert!(!may_start(1, 0));
    }
}
