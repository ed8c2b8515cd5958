//! How the cluster map changes: [`apply_cluster`], the metadata group's
//! apply rule (bootstrap, compare-and-set map changes, tokens, quotas and
//! signing secrets).

use crate::ShardId;
use crate::routing::Ring;

use super::ClusterCommand;
use super::ClusterMap;
use super::ClusterOutcome;
use super::MAX_ADDR_BYTES;
use super::MAX_NAMESPACE_SETTINGS;
use super::MAX_NODES;
use super::MAX_PREVIOUS_SECRETS;
use super::MAX_REPLICAS;
use super::MapChange;
use super::MapError;
use super::MapNode;
use super::NamespaceQuota;
use super::NamespaceSecrets;
use super::NewNode;
use super::NodeStatus;
use super::PauseTarget;
use super::Placement;
use super::SECRET_BYTES;
use super::SecretChange;
use super::TokenChange;
use super::plan::sorted;

/// Applies one command to `map` at the leader's time `now_ms`. A refused
/// command leaves `map` as it was. `Err` means the stored map itself breaks
/// a rule: the caller stops the group.
pub fn apply_cluster(map: &mut ClusterMap, cmd: &ClusterCommand, now_ms: u64) -> Result<ClusterOutcome, String> {
    map.check().map_err(|e| format!("the stored cluster map at epoch {} is corrupt: {e}", map.epoch))?;
    let result = match cmd {
        ClusterCommand::Bootstrap { num_shards, replication_factor, nodes, cluster_id } => {
            if map.is_bootstrapped() {
                return Ok(ClusterOutcome::Unchanged { epoch: map.epoch });
            }
            bootstrap(*num_shards, *replication_factor, nodes, cluster_id, now_ms)
        }
        ClusterCommand::Change(change) => change_map(map, change, now_ms),
        ClusterCommand::Token(change) => change_tokens(map, change, now_ms),
        ClusterCommand::Quota { namespace, quota } => change_quota(map, namespace, *quota, now_ms),
        ClusterCommand::Secret { namespace, change } => change_secret(map, namespace, change, now_ms),
        ClusterCommand::Pause { target, paused } => change_pause(map, target, *paused, now_ms),
    };
    Ok(match result {
        Ok(Some(next)) => {
            *map = next;
            ClusterOutcome::Changed { epoch: map.epoch }
        }
        Ok(None) => ClusterOutcome::Unchanged { epoch: map.epoch },
        Err(error) => ClusterOutcome::Refused { epoch: map.epoch, error },
    })
}

/// A change to the map's settings (tokens, quotas, secrets) on a
/// bootstrapped map: `edit` changes a copy and says whether it changed
/// anything. A change raises the epoch like any map change, so every
/// node's cache (which takes only newer epochs) picks it up.
fn change_settings(
    map: &ClusterMap,
    now_ms: u64,
    edit: impl FnOnce(&mut ClusterMap) -> Result<bool, MapError>,
) -> Result<Option<ClusterMap>, MapError> {
    if !map.is_bootstrapped() {
        return Err(MapError::NotBootstrapped);
    }
    let mut next = map.clone();
    if !edit(&mut next)? {
        return Ok(None);
    }
    next.epoch = map.epoch + 1;
    next.changed_at_ms = now_ms;
    Ok(Some(next))
}

fn change_tokens(map: &ClusterMap, change: &TokenChange, now_ms: u64) -> Result<Option<ClusterMap>, MapError> {
    change_settings(map, now_ms, |next| match change {
        TokenChange::Create { id, record } => {
            if !crate::auth::valid_token_id(id) {
                return Err(MapError::Invalid(format!("token id {id:?}: 1 to 32 letters, digits or -")));
            }
            if next.tokens.contains_key(id) {
                return Err(MapError::Invalid(format!("token id {id} is taken")));
            }
            if next.tokens.len() >= crate::auth::MAX_TOKENS {
                return Err(MapError::Invalid(format!(
                    "the cluster holds {} tokens, the most it may",
                    next.tokens.len()
                )));
            }
            record.check().map_err(MapError::Invalid)?;
            next.tokens.insert(id.clone(), record.clone());
            Ok(true)
        }
        TokenChange::Revoke { id } => Ok(next.tokens.remove(id).is_some()),
    })
}

/// A namespace's quota: set (replacing any) or cleared.
fn change_quota(
    map: &ClusterMap,
    namespace: &str,
    quota: Option<NamespaceQuota>,
    now_ms: u64,
) -> Result<Option<ClusterMap>, MapError> {
    crate::validate::check_namespace(namespace).map_err(|e| MapError::Invalid(e.to_string()))?;
    change_settings(map, now_ms, |next| match quota {
        Some(q) if q == NamespaceQuota::default() => {
            Err(MapError::Invalid("a quota needs max_pending or creates_per_sec; clear it instead".into()))
        }
        Some(q) => {
            if !next.quotas.contains_key(namespace) && next.quotas.len() >= MAX_NAMESPACE_SETTINGS {
                return Err(MapError::Invalid(format!("at most {MAX_NAMESPACE_SETTINGS} namespaces have a quota")));
            }
            Ok(next.quotas.insert(namespace.to_string(), q) != Some(q))
        }
        None => Ok(next.quotas.remove(namespace).is_some()),
    })
}

/// A namespace's firing, or an endpoint's deliveries, paused or resumed.
/// Pausing what is paused (or resuming what is not) changes nothing.
fn change_pause(
    map: &ClusterMap,
    target: &PauseTarget,
    paused: bool,
    now_ms: u64,
) -> Result<Option<ClusterMap>, MapError> {
    let name = match target {
        PauseTarget::Namespace(ns) => {
            crate::validate::check_namespace(ns).map_err(|e| MapError::Invalid(e.to_string()))?;
            ns
        }
        PauseTarget::Endpoint(origin) => {
            if !super::is_origin(origin) {
                return Err(MapError::Invalid(format!(
                    "endpoint {origin:?} is not scheme://host[:port] (http or https, at most {} bytes)",
                    super::MAX_ENDPOINT_BYTES
                )));
            }
            origin
        }
    };
    change_settings(map, now_ms, |next| {
        let set = match target {
            PauseTarget::Namespace(_) => &mut next.paused_namespaces,
            PauseTarget::Endpoint(_) => &mut next.paused_endpoints,
        };
        if !paused {
            return Ok(set.remove(name).is_some());
        }
        if set.contains_key(name) {
            return Ok(false);
        }
        if set.len() >= MAX_NAMESPACE_SETTINGS {
            return Err(MapError::Invalid(format!("at most {MAX_NAMESPACE_SETTINGS} paused at once")));
        }
        set.insert(name.clone(), now_ms);
        Ok(true)
    })
}

/// A namespace's signing secrets: rotated, their rotation finished, or
/// cleared.
fn change_secret(
    map: &ClusterMap,
    namespace: &str,
    change: &SecretChange,
    now_ms: u64,
) -> Result<Option<ClusterMap>, MapError> {
    crate::validate::check_namespace(namespace).map_err(|e| MapError::Invalid(e.to_string()))?;
    change_settings(map, now_ms, |next| match change {
        SecretChange::Rotate { secret } => {
            if !SECRET_BYTES.contains(&secret.0.len()) {
                return Err(MapError::Invalid(format!(
                    "a signing secret has {} to {} bytes, not {}",
                    SECRET_BYTES.start(),
                    SECRET_BYTES.end(),
                    secret.0.len()
                )));
            }
            let entry = match next.secrets.remove(namespace) {
                Some(mut old) => {
                    if old.current == *secret || old.previous.contains(secret) {
                        return Err(MapError::Invalid("that secret was used before; draw a new one".into()));
                    }
                    old.previous.insert(0, std::mem::replace(&mut old.current, secret.clone()));
                    old.previous.truncate(MAX_PREVIOUS_SECRETS);
                    old.rotated_at_ms = now_ms;
                    old
                }
                None => {
                    if next.secrets.len() >= MAX_NAMESPACE_SETTINGS {
                        return Err(MapError::Invalid(format!(
                            "at most {MAX_NAMESPACE_SETTINGS} namespaces have a secret"
                        )));
                    }
                    NamespaceSecrets { current: secret.clone(), previous: Vec::new(), rotated_at_ms: now_ms }
                }
            };
            next.secrets.insert(namespace.to_string(), entry);
            Ok(true)
        }
        SecretChange::DropPrevious => Ok(match next.secrets.get_mut(namespace) {
            Some(s) if !s.previous.is_empty() => {
                s.previous.clear();
                true
            }
            _ => false,
        }),
        SecretChange::Clear => Ok(next.secrets.remove(namespace).is_some()),
    })
}

fn check_new_node(node: &NewNode) -> Result<(), MapError> {
    if node.id == 0 {
        return Err(MapError::Invalid("node ids start at 1".into()));
    }
    if node.grpc_addr.is_empty() || node.peer_addr.is_empty() {
        return Err(MapError::Invalid(format!("node {} needs a grpc and a peer address", node.id)));
    }
    if [&node.grpc_addr, &node.http_addr, &node.peer_addr].iter().any(|a| a.len() > MAX_ADDR_BYTES) {
        return Err(MapError::Invalid(format!("node {}'s address is longer than {MAX_ADDR_BYTES} bytes", node.id)));
    }
    Ok(())
}

fn bootstrap(
    num_shards: u32,
    replication_factor: u32,
    nodes: &[NewNode],
    cluster_id: &str,
    now_ms: u64,
) -> Result<Option<ClusterMap>, MapError> {
    if num_shards == 0 || replication_factor == 0 || nodes.is_empty() {
        return Err(MapError::Invalid("a cluster needs shards, a replication factor and a node".into()));
    }
    if !super::is_cluster_id(cluster_id) {
        return Err(MapError::Invalid(format!("cluster id {cluster_id:?} is not 16 hex digits")));
    }
    let mut map = ClusterMap {
        epoch: 1,
        num_shards,
        replication_factor,
        changed_at_ms: now_ms,
        cluster_id: cluster_id.to_string(),
        ..Default::default()
    };
    for n in nodes {
        check_new_node(n)?;
        let entry = MapNode {
            grpc_addr: n.grpc_addr.clone(),
            http_addr: n.http_addr.clone(),
            peer_addr: n.peer_addr.clone(),
            status: NodeStatus::Active,
            since_epoch: 1,
        };
        if map.nodes.insert(n.id, entry).is_some() {
            return Err(MapError::Invalid(format!("node {} is named twice", n.id)));
        }
    }
    map.ring = map.ring_over_eligible();
    let ring = Ring::from_tokens(map.ring.clone());
    let rf = (replication_factor as usize).min(map.nodes.len());
    map.shards = (0..num_shards).map(|s| Placement { replicas: sorted(ring.replicas(s, rf)), epoch: 1 }).collect();
    map.check().map_err(MapError::Invalid)?;
    Ok(Some(map))
}

fn change_map(map: &ClusterMap, change: &MapChange, now_ms: u64) -> Result<Option<ClusterMap>, MapError> {
    if !map.is_bootstrapped() {
        return Err(MapError::NotBootstrapped);
    }
    if change.expected_epoch != map.epoch {
        return Err(MapError::StaleEpoch { expected: change.expected_epoch, current: map.epoch });
    }
    let epoch = map.epoch + 1;
    let mut next = map.clone();
    let mut changed = false;
    for n in &change.add {
        check_new_node(n)?;
        match next.nodes.get(&n.id) {
            Some(e) if e.status == NodeStatus::Removed => {
                return Err(MapError::IdRetired { id: n.id, epoch: e.since_epoch });
            }
            Some(e) if e.grpc_addr == n.grpc_addr => {}
            Some(e) => return Err(MapError::IdTaken { id: n.id, grpc_addr: e.grpc_addr.clone() }),
            None => {
                if let Some((id, _)) =
                    next.nodes.iter().find(|(_, e)| e.status != NodeStatus::Removed && e.grpc_addr == n.grpc_addr)
                {
                    return Err(MapError::AddressTaken { addr: n.grpc_addr.clone(), id: *id });
                }
                let entry = MapNode {
                    grpc_addr: n.grpc_addr.clone(),
                    http_addr: n.http_addr.clone(),
                    peer_addr: n.peer_addr.clone(),
                    status: NodeStatus::Joining,
                    since_epoch: epoch,
                };
                next.nodes.insert(n.id, entry);
                changed = true;
            }
        }
    }
    if next.nodes.len() > MAX_NODES {
        return Err(MapError::Invalid(format!("a cluster map holds at most {MAX_NODES} nodes")));
    }
    for (id, to) in &change.status {
        let entry = next.nodes.get_mut(id).ok_or(MapError::UnknownNode(*id))?;
        let from = entry.status;
        if from == *to {
            continue;
        }
        // Removed is final; nothing returns to Joining. Whether a node
        // that leaves still holds replicas is the placement rule's call.
        let allowed = match from {
            NodeStatus::Joining => true,
            NodeStatus::Active | NodeStatus::Draining => *to != NodeStatus::Joining,
            NodeStatus::Removed => false,
        };
        if !allowed {
            return Err(MapError::BadTransition { id: *id, from, to: *to });
        }
        entry.status = *to;
        entry.since_epoch = epoch;
        changed = true;
    }
    for (shard, replicas) in &change.placements {
        let slot = next.shards.get_mut(*shard as usize).ok_or_else(|| MapError::BadPlacement {
            shard: *shard,
            message: format!("there are only {} shards", map.num_shards),
        })?;
        let target = sorted(replicas.clone());
        if target.len() != replicas.len() {
            return Err(MapError::BadPlacement { shard: *shard, message: format!("{replicas:?} names a node twice") });
        }
        // More copies than the replication factor are never a target: a
        // later drain plans for the factor and would leave the extra copy.
        if target.len() > map.replication_factor as usize {
            return Err(MapError::BadPlacement {
                shard: *shard,
                message: format!(
                    "{replicas:?} names {} nodes, more than the replication factor of {}",
                    target.len(),
                    map.replication_factor
                ),
            });
        }
        if slot.replicas != target {
            slot.replicas = target;
            slot.epoch = epoch;
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    // Which rule a change breaks, in the operator's terms.
    for (shard, p) in next.shards.iter().enumerate() {
        let shard = shard as ShardId;
        if p.replicas.is_empty() || p.replicas.len() > MAX_REPLICAS {
            return Err(MapError::BadPlacement {
                shard,
                message: format!("needs 1 to {MAX_REPLICAS} replicas, not {}", p.replicas.len()),
            });
        }
        for id in &p.replicas {
            match next.status(*id) {
                None => return Err(MapError::UnknownNode(*id)),
                Some(s) if !s.may_hold_replicas() => {
                    return Err(MapError::BadPlacement {
                        shard,
                        message: format!("node {id} is {} and may hold no replica", s.name()),
                    });
                }
                Some(_) => {}
            }
        }
    }
    next.epoch = epoch;
    next.changed_at_ms = now_ms;
    next.ring = next.ring_over_eligible();
    next.check().map_err(MapError::Invalid)?;
    Ok(Some(next))
}
