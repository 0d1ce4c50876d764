//! The nodes as the controller weighs them: where each node's hydrator daemon answers, and
//! whether a pod set's pods may run there (its nodeSelector, its flavors' node labels, the
//! node's taints against its tolerations).
//!
//! A node counts only with a daemon pod that is Ready on it: a node without one cannot warm
//! a dataset nor serve a csi volume, whatever its labels say.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, Taint, Toleration};

/// One node, with the address of its daemon's API when one is Ready there.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Cordoned (`spec.unschedulable`) or not Ready: no new pod goes there.
    pub closed: bool,
    /// `IP:PORT` of the daemon's API.
    pub daemon: Option<String>,
}

impl NodeView {
    /// The value of the node's `kubernetes.io/hostname` label (what a topology assignment
    /// names), or its name.
    pub(crate) fn hostname(&self) -> &str {
        self.labels
            .get(super::topology::HOSTNAME_LEVEL)
            .map_or(self.name.as_str(), String::as_str)
    }
}

/// The cluster's nodes, each with its Ready daemon's address (`port` on the pod's IP).
pub(crate) fn views<N: Borrow<Node>, P: Borrow<Pod>>(
    nodes: &[N],
    daemons: &[P],
    port: u16,
) -> BTreeMap<String, NodeView> {
    let mut addresses = BTreeMap::new();
    for pod in daemons
        .iter()
        .map(Borrow::borrow)
        .filter(|pod| pod_ready(pod))
    {
        let node = pod.spec.as_ref().and_then(|spec| spec.node_name.clone());
        let ip = pod.status.as_ref().and_then(|status| status.pod_ip.clone());
        if let (Some(node), Some(ip)) = (node, ip) {
            let host = match ip.contains(':') {
                true => format!("[{ip}]"),
                false => ip,
            };
            addresses.insert(node, format!("{host}:{port}"));
        }
    }
    nodes
        .iter()
        .map(Borrow::borrow)
        .filter_map(|node: &Node| {
            let name = node.metadata.name.clone()?;
            let spec = node.spec.clone().unwrap_or_default();
            let ready = (node.status.as_ref())
                .and_then(|status| status.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let view = NodeView {
                daemon: addresses.get(&name).cloned(),
                labels: node.metadata.labels.clone().unwrap_or_default(),
                taints: spec.taints.unwrap_or_default(),
                closed: spec.unschedulable == Some(true) || !ready,
                name: name.clone(),
            };
            Some((name, view))
        })
        .collect()
}

fn pod_ready(pod: &Pod) -> bool {
    (pod.status.as_ref())
        .and_then(|status| status.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// What a pod set's pods ask of a node.
#[derive(Clone, Debug, Default)]
pub(crate) struct Placement {
    /// The template's nodeSelector and the node labels of its assigned flavors.
    pub labels: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
}

impl Placement {
    pub(crate) fn of(spec: Option<&PodSpec>, flavor_labels: &BTreeMap<String, String>) -> Self {
        let mut labels = flavor_labels.clone();
        let spec = spec.cloned().unwrap_or_default();
        labels.extend(spec.node_selector.unwrap_or_default());
        Placement {
            labels,
            tolerations: spec.tolerations.unwrap_or_default(),
        }
    }

    /// Whether the pods may be scheduled on `node`.
    pub(crate) fn admits(&self, node: &NodeView) -> bool {
        let labelled = (self.labels.iter()).all(|(key, value)| node.labels.get(key) == Some(value));
        let tolerated = (node.taints.iter())
            .filter(|taint| taint.effect != "PreferNoSchedule")
            .all(|taint| self.tolerations.iter().any(|t| tolerates(t, taint)));
        labelled && tolerated && !node.closed
    }
}

/// The scheduler's rule (`ToleratesTaint`): same effect or none, same key or none with
/// `Exists`, and the same value with `Equal` (the default operator).
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" => {
            !key.is_empty()
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value, ready: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .unwrap()
    }

    fn daemon(node: &str, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("hydrator-{node}"), "namespace": "hydrator-system"},
            "spec": {"nodeName": node, "containers": []},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_node_has_a_daemon_only_where_one_is_ready() {
        let nodes = [
            node("gpu-1", json!({}), json!([]), true),
            node("gpu-2", json!({}), json!([]), true),
            node("gpu-3", json!({}), json!([]), true),
        ];
        let pods = [
            daemon("gpu-1", "10.88.0.5", true),
            daemon("gpu-2", "fd00::7", false),
        ];
        let views = views(&nodes, &pods, 7070);
        assert_eq!(views["gpu-1"].daemon.as_deref(), Some("10.88.0.5:7070"));
        assert_eq!(views["gpu-2"].daemon, None);
        assert_eq!(views["gpu-3"].daemon, None);
        let v6 = super::views(&nodes, &[daemon("gpu-3", "fd00::7", true)], 7070);
        assert_eq!(v6["gpu-3"].daemon.as_deref(), Some("[fd00::7]:7070"));
    }

    #[test]
    fn placement_follows_labels_taints_and_readiness() {
        let nodes = [
            node(
                "a100",
                json!({"gpu": "a100", "pool": "train"}),
                json!([]),
                true,
            ),
            node(
                "h100",
                json!({"gpu": "h100", "pool": "train"}),
                json!([]),
                true,
            ),
            node(
                "tainted",
                json!({"gpu": "a100", "pool": "train"}),
                json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
                true,
            ),
            node(
                "down",
                json!({"gpu": "a100", "pool": "train"}),
                json!([]),
                false,
            ),
        ];
        let views = views(&nodes, &[] as &[Pod], 7070);
        let spec: PodSpec = serde_json::from_value(json!({
            "containers": [], "nodeSelector": {"pool": "train"}}))
        .unwrap();
        let flavor = [("gpu".to_string(), "a100".to_string())].into();
        let plain = Placement::of(Some(&spec), &flavor);
        let admitted: Vec<&str> = (views.values())
            .filter(|n| plain.admits(n))
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(admitted, ["a100"]);

        let tolerant: PodSpec = serde_json::from_value(json!({"containers": [],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}))
        .unwrap();
        let tolerant = Placement::of(Some(&tolerant), &flavor);
        assert!(tolerant.admits(&views["tainted"]));
        let wrong_value: PodSpec = serde_json::from_value(json!({"containers": [],
            "tolerations": [{"key": "nvidia.com/gpu", "value": "absent"}]}))
        .unwrap();
        assert!(!Placement::of(Some(&wrong_value), &flavor).admits(&views["tainted"]));
    }
}
