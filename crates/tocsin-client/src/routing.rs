//! Routing: the cached shard map (refreshed from every node that answers,
//! merged by the contract's rule), which node to send a shard's request to,
//! and what an answer teaches about where a shard's leader is.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::conn::Conn;
use tocsin_proto::v1 as pb;
use tocsin_proto::v1::admin_service_client::AdminServiceClient;

use crate::Client;
use crate::ClientError;
use crate::MAP_EPOCH_HEADER;
use crate::REFRESH_GRACE;
use crate::Route;
use crate::SUSPECT_FOR;

impl Client {
    pub(crate) fn channel(&self, addr: &str) -> Result<Conn, ClientError> {
        let mut channels = self.inner.channels.lock().expect("channels lock");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = self.endpoint(addr)?.timeout(self.inner.options.request_timeout);
        let channel = Conn::new(endpoint.connect_lazy(), self.inner.authorization.clone());
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// Reloads the shard map from every node that answers within a short
    /// grace period after the first, merged (see `tocsin_contract::map`).
    pub async fn refresh(&self) -> Result<pb::ShardMap, ClientError> {
        use futures::StreamExt;
        let mut candidates: Vec<String> = self.inner.seeds.clone();
        if let Some(route) = self.inner.route.read().expect("route lock").as_ref() {
            candidates.extend(route.addrs.values().cloned());
        }
        candidates.sort();
        candidates.dedup();
        // Ask every node at once: a frozen node must not hold the refresh
        // up, and each answer is merged by term, so the newest leader wins.
        let mut asks: futures::stream::FuturesUnordered<_> = candidates
            .into_iter()
            .filter_map(|addr| {
                let channel = self.channel(&addr).ok()?;
                let timeout = self.inner.options.request_timeout;
                Some(async move {
                    let mut admin = AdminServiceClient::new(channel);
                    let answer = tokio::time::timeout(timeout, admin.get_shard_map(pb::GetShardMapRequest {})).await;
                    (addr, answer)
                })
            })
            .collect();
        let mut best = tocsin_contract::map::MapMerge::default();
        let mut last = String::from("no node to ask");
        let mut grace_until: Option<tokio::time::Instant> = None;
        loop {
            let next = match grace_until {
                Some(until) => match tokio::time::timeout_at(until, asks.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                None => asks.next().await,
            };
            let Some((addr, answer)) = next else { break };
            match answer {
                Ok(Ok(map)) => {
                    let map = map.into_inner();
                    self.install(&map);
                    best.add(None, map);
                    grace_until.get_or_insert_with(|| tokio::time::Instant::now() + REFRESH_GRACE);
                }
                Ok(Err(e)) => last = format!("{addr}: {e}"),
                Err(_) => {
                    self.suspect(&addr);
                    last = format!("{addr}: no answer within {:?}", self.inner.options.request_timeout);
                }
            }
        }
        best.into_map().ok_or(ClientError::Unreachable(last))
    }

    /// Refreshes the map unless one at least as new as `epoch` is already
    /// installed (another request's refresh got there first).
    pub(crate) async fn refresh_to(&self, epoch: u64) {
        let _one = self.inner.refreshing.lock().await;
        if self.map_epoch() >= epoch {
            return;
        }
        let _ = self.refresh().await;
    }

    /// Refreshes the map after a failed attempt, unless another one did in
    /// the last [`crate::REFRESH_AFTER_FAILURE_EVERY`]: concurrent failures
    /// wait for one refresh instead of each asking every node.
    pub(crate) async fn refresh_after_failure(&self) {
        let mut last = self.inner.refreshing.lock().await;
        if last.is_some_and(|at| at.elapsed() < crate::REFRESH_AFTER_FAILURE_EVERY) {
            return;
        }
        let _ = self.refresh().await;
        *last = Some(std::time::Instant::now());
    }

    /// `message` as a request routed by the current map: it carries the
    /// map's epoch.
    pub(crate) fn routed<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let epoch = self.map_epoch();
        if epoch > 0 {
            request.metadata_mut().insert(MAP_EPOCH_HEADER, epoch.into());
        }
        request
    }

    /// Avoids `addr` for a while after it failed to answer.
    pub(crate) fn suspect(&self, addr: &str) {
        self.inner.suspects.lock().expect("suspects lock").insert(addr.to_string(), Instant::now() + SUSPECT_FOR);
    }

    pub(crate) fn is_suspect(&self, addr: &str) -> bool {
        let mut suspects = self.inner.suspects.lock().expect("suspects lock");
        match suspects.get(addr) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                suspects.remove(addr);
                false
            }
            None => false,
        }
    }

    /// Installs a freshly loaded map. Per shard, a leader learned in a lower
    /// term than the one cached is ignored: a node cut off from its peers
    /// may still answer with an old view. The node list comes from the
    /// newest cluster map seen (a node that lags may still list a removed
    /// node as active), and the epoch never goes back.
    pub(crate) fn install(&self, map: &pb::ShardMap) {
        let n = map.num_shards as usize;
        let mut route = self.inner.route.write().expect("route lock");
        let (mut leaders, mut terms) = match route.as_ref() {
            Some(r) if r.num_shards == map.num_shards => (r.leaders.clone(), r.terms.clone()),
            _ => (vec![0u64; n], vec![0u64; n]),
        };
        for s in &map.shards {
            let i = s.shard as usize;
            if i < n && s.leader != 0 && (s.term >= terms[i] || leaders[i] == 0) {
                leaders[i] = s.leader;
                terms[i] = terms[i].max(s.term);
            }
        }
        let removed = pb::node_info::State::Removed as i32;
        let listed: BTreeMap<u64, String> =
            map.nodes.iter().filter(|n| n.state != removed).map(|n| (n.node_id, n.grpc_addr.clone())).collect();
        let (addrs, epoch) = match route.as_ref() {
            Some(r) if r.epoch > map.epoch => {
                let mut addrs = r.addrs.clone();
                for (id, addr) in listed {
                    let gone = map.nodes.iter().any(|n| n.node_id == id && n.state == removed);
                    if !gone {
                        addrs.entry(id).or_insert(addr);
                    }
                }
                (addrs, r.epoch)
            }
            _ => (listed, map.epoch),
        };
        *route = Some(Route { num_shards: map.num_shards, leaders, terms, addrs, epoch });
    }

    /// Forgets the cached leader of `shard` after it failed to answer, so
    /// the next attempt goes to another node (which forwards it).
    pub(crate) fn forget_leader(&self, shard: Option<u32>) {
        let Some(shard) = shard else { return };
        if let Some(route) = self.inner.route.write().expect("route lock").as_mut()
            && let Some(l) = route.leaders.get_mut(shard as usize)
        {
            *l = 0;
        }
    }

    /// The shard map as last loaded.
    pub fn num_shards(&self) -> u32 {
        self.inner.route.read().expect("route lock").as_ref().map_or(0, |r| r.num_shards)
    }

    /// The map epoch as last loaded.
    pub fn map_epoch(&self) -> u64 {
        self.inner.route.read().expect("route lock").as_ref().map_or(0, |r| r.epoch)
    }

    /// The shard of a key.
    pub fn shard_of(&self, namespace: &str, id: &str) -> u32 {
        tocsin_core::routing::shard_for(namespace, id, self.num_shards().max(1))
    }

    /// Where to send a request for `shard`: its leader, or any node,
    /// avoiding nodes that just failed to answer while others remain.
    pub(crate) fn addr_for(&self, shard: Option<u32>, attempt: u32) -> Result<String, ClientError> {
        let route = self.inner.route.read().expect("route lock");
        let Some(route) = route.as_ref() else {
            return Ok(self.inner.seeds[attempt as usize % self.inner.seeds.len()].clone());
        };
        if let Some(shard) = shard
            && let Some(addr) = route.leaders.get(shard as usize).and_then(|l| route.addrs.get(l))
            && !self.is_suspect(addr)
        {
            return Ok(addr.clone());
        }
        let mut all: Vec<&String> = route.addrs.values().collect();
        if all.is_empty() {
            return Ok(self.inner.seeds[attempt as usize % self.inner.seeds.len()].clone());
        }
        all.sort();
        let healthy: Vec<&String> = all.iter().copied().filter(|a| !self.is_suspect(a)).collect();
        let pool = if healthy.is_empty() { &all } else { &healthy };
        Ok(pool[attempt as usize % pool.len()].clone())
    }

    /// The address of `shard`'s leader, if the map knows it and the node
    /// has not just failed to answer.
    pub(crate) fn leader_addr(&self, shard: u32) -> Option<String> {
        let route = self.inner.route.read().expect("route lock");
        let route = route.as_ref()?;
        let addr = route.leaders.get(shard as usize).and_then(|l| route.addrs.get(l))?;
        (!self.is_suspect(addr)).then(|| addr.clone())
    }

    /// Learns from an error: a leader hint updates the cached leader.
    pub(crate) fn learn(&self, shard: Option<u32>, err: &ClientError) -> bool {
        let ClientError::Status { info, .. } = err else { return false };
        let Some(hint) = &info.leader else { return false };
        let mut route = self.inner.route.write().expect("route lock");
        let Some(route) = route.as_mut() else { return false };
        if hint.grpc_addr.is_empty() {
            return false;
        }
        route.addrs.insert(hint.node_id, hint.grpc_addr.clone());
        let shard = shard.unwrap_or(hint.shard);
        if let Some(l) = route.leaders.get_mut(shard as usize) {
            let changed = *l != hint.node_id;
            *l = hint.node_id;
            return changed;
        }
        false
    }

    /// A node forwarded a request for `shard` to `leader`: route the shard
    /// there from now on, if the map says where that node is.
    pub(crate) fn learned_leader(&self, shard: Option<u32>, leader: u64) {
        let Some(shard) = shard else { return };
        let mut route = self.inner.route.write().expect("route lock");
        if let Some(route) = route.as_mut()
            && route.addrs.contains_key(&leader)
            && let Some(l) = route.leaders.get_mut(shard as usize)
        {
            *l = leader;
        }
    }
}
