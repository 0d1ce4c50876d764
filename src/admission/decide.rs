//! What the check answers for one Workload, from the cluster as the controller saw it this
//! round: pure functions, so every answer Kueue can get is tested without a cluster.
//!
//! A round has three steps. [`plan`] names the (node, dataset) pairs to warm: the nodes
//! Topology-Aware Scheduling assigned, or else the nodes chosen here (warm ones first). The
//! loop then asks those nodes' daemons ([`Budget`] decides which cold pairs may start), and
//! [`conclude`] turns what they said into Ready, Pending, Retry or Rejected.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::daemons::Holding;
use super::kueue::{state, PodSetUpdate, ResourceFlavorSpec, Workload};
use super::labels::warm_label;
use super::nodes::{NodeView, Placement};
use super::topology;
use super::wants;
use crate::daemon::protocol::{DatasetStatus, State};
use crate::units::human_bytes;

/// The cluster as seen this round.
pub(crate) struct World<'a> {
    pub nodes: &'a BTreeMap<String, NodeView>,
    /// By node name, for the nodes with a Ready daemon.
    pub holdings: &'a BTreeMap<String, Holding>,
    pub flavors: &'a BTreeMap<String, ResourceFlavorSpec>,
    /// The CSI driver's name in pods' volumes.
    pub driver: &'a str,
}

impl World<'_> {
    fn serving(&self, node: &str) -> Option<&BTreeMap<String, DatasetStatus>> {
        self.holdings.get(node)?.serving()
    }

    /// Whether some daemon's catalog names `dataset`; `None` when no daemon answered.
    fn known(&self, dataset: &str) -> Option<bool> {
        let mut serving = self
            .holdings
            .values()
            .filter_map(Holding::serving)
            .peekable();
        serving.peek()?;
        Some(serving.any(|datasets| datasets.contains_key(dataset)))
    }

    /// What `target`'s daemon said of its dataset this round, or why there is nothing to go on
    /// (as the progress to report).
    pub(crate) fn status(&self, target: &Target) -> Result<&DatasetStatus, Progress> {
        let unreachable = |why: String| Progress::Unreachable(why);
        match self.holdings.get(&target.node) {
            Some(Holding::Serving(datasets)) => datasets.get(&target.dataset).ok_or_else(|| {
                unreachable(format!("the catalog of {} does not name it", target.node))
            }),
            Some(Holding::Unreachable(why)) => Err(unreachable(why.clone())),
            None => Err(unreachable(format!("no daemon on {}", target.node))),
        }
    }
}

/// Why the nodes of a pod set placed by Topology-Aware Scheduling cannot be warmed.
#[derive(Debug, thiserror::Error)]
enum Unplaced {
    #[error("assigned node {0:?} is not in the cluster")]
    UnknownNode(String),
    #[error("assigned node {0} has no Ready hydrator daemon")]
    NoDaemon(String),
}

/// The check's answer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Verdict {
    pub state: &'static str,
    pub message: String,
    pub pod_set_updates: Vec<PodSetUpdate>,
}

impl Verdict {
    fn pending(message: String) -> Self {
        Verdict {
            state: state::PENDING,
            message,
            pod_set_updates: Vec::new(),
        }
    }

    fn rejected(message: String) -> Self {
        Verdict {
            state: state::REJECTED,
            ..Verdict::pending(message)
        }
    }
}

/// One dataset to have on one node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Target {
    pub node: String,
    pub dataset: String,
}

/// The pairs to warm for a workload, or the answer when none can be named.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub targets: BTreeSet<Target>,
    /// The node selectors of the pod sets placed here (not by TAS), once every target is warm.
    pub selectors: Vec<PodSetUpdate>,
    pub verdict: Option<Verdict>,
}

/// The pairs `workload` needs warm.
pub(crate) fn plan(workload: &Workload, world: &World) -> Plan {
    let mut plan = Plan::default();
    let mut why_not = Vec::new();
    for pod_set in &workload.spec.pod_sets {
        let datasets = wants::datasets(&pod_set.template, world.driver);
        if datasets.is_empty() {
            continue;
        }
        for dataset in &datasets {
            if world.known(dataset) == Some(false) {
                plan.verdict = Some(Verdict::rejected(format!(
                    "dataset {dataset:?} (pod set {}) is not in the node cache's catalog",
                    pod_set.name
                )));
                return plan;
            }
        }
        let assignment = workload.assignment(&pod_set.name);
        let topology = assignment.and_then(|a| a.topology_assignment.as_ref());
        let nodes = match topology.and_then(topology::hostnames) {
            Some(hostnames) => match assigned_nodes(&hostnames, world) {
                Ok(nodes) => nodes,
                Err(why) => {
                    why_not.push(format!("pod set {}: {why}", pod_set.name));
                    continue;
                }
            },
            None => {
                for dataset in &datasets {
                    if warm_label(dataset).is_none() {
                        plan.verdict = Some(Verdict::rejected(format!(
                            "dataset {dataset:?} cannot name a node label (at most 63 letters, digits, '-', '_' or '.'), which pod set {} needs without Topology-Aware Scheduling",
                            pod_set.name
                        )));
                        return plan;
                    }
                }
                let flavor_labels = (assignment.into_iter())
                    .flat_map(|a| a.flavors.values())
                    .filter_map(|flavor| world.flavors.get(flavor))
                    .flat_map(|flavor| flavor.node_labels.clone())
                    .collect();
                let placement = Placement::of(pod_set.template.spec.as_ref(), &flavor_labels);
                let count = assignment.and_then(|a| a.count).unwrap_or(pod_set.count);
                let chosen = choose(&placement, &datasets, count.max(1) as usize, world);
                if chosen.is_empty() {
                    why_not.push(format!(
                        "pod set {}: no Ready node with a hydrator daemon admits its pods ({})",
                        pod_set.name,
                        placement_words(&placement)
                    ));
                    continue;
                }
                plan.selectors.push(PodSetUpdate {
                    name: pod_set.name.clone(),
                    node_selector: (datasets.iter())
                        .filter_map(|d| warm_label(d))
                        .map(|label| (label, "ready".to_string()))
                        .collect(),
                });
                chosen
            }
        };
        for node in nodes {
            for dataset in &datasets {
                let dataset = dataset.clone();
                let node = node.clone();
                plan.targets.insert(Target { node, dataset });
            }
        }
    }
    if !why_not.is_empty() {
        plan.verdict = Some(Verdict::pending(why_not.join("; ")));
    } else if plan.targets.is_empty() {
        plan.verdict = Some(Verdict {
            state: state::READY,
            ..Verdict::pending("no hydrator dataset in its pod sets".into())
        });
    }
    plan
}

/// The nodes whose `kubernetes.io/hostname` a topology assignment names.
fn assigned_nodes(hostnames: &[String], world: &World) -> Result<Vec<String>, Unplaced> {
    let mut nodes = Vec::new();
    for hostname in hostnames {
        let node = (world.nodes.values()).find(|n| n.hostname() == hostname);
        match node {
            None => return Err(Unplaced::UnknownNode(hostname.clone())),
            Some(node) if !world.holdings.contains_key(&node.name) => {
                return Err(Unplaced::NoDaemon(node.name.clone()))
            }
            Some(node) => nodes.push(node.name.clone()),
        }
    }
    Ok(nodes)
}

/// Up to `count` nodes for a pod set: those whose pods it admits and whose daemon serves
/// every dataset; those holding them all ready first, then those hydrating them, by name.
fn choose(
    placement: &Placement,
    datasets: &BTreeSet<String>,
    count: usize,
    world: &World,
) -> Vec<String> {
    let mut candidates: Vec<(u8, &str)> = (world.nodes.values())
        .filter(|node| placement.admits(node))
        .filter_map(|node| {
            let held = world.serving(&node.name)?;
            let states: Option<Vec<State>> = (datasets.iter())
                .map(|d| held.get(d).map(|status| usable(status).0))
                .collect();
            let states = states?;
            let rank = match () {
                _ if states.iter().all(|s| *s == State::Ready) => 0,
                _ if states
                    .iter()
                    .all(|s| matches!(s, State::Ready | State::Hydrating)) =>
                {
                    1
                }
                _ => 2,
            };
            Some((rank, node.name.as_str()))
        })
        .collect();
    candidates.sort();
    let chosen = candidates
        .iter()
        .take(count)
        .map(|(_, name)| name.to_string());
    chosen.collect()
}

/// Where a dataset stands for a pod about to mount it: a refresh hydrating beside a ready
/// snapshot still serves that snapshot at once.
fn usable(status: &DatasetStatus) -> (State, Option<&str>) {
    match (status.state, status.held_snapshot.as_deref()) {
        (State::Hydrating, Some(held)) => (State::Ready, Some(held)),
        (state, _) => (state, status.snapshot.as_deref()),
    }
}

fn placement_words(placement: &Placement) -> String {
    match placement.labels.is_empty() {
        true => "any node".into(),
        false => {
            let labels: Vec<String> = (placement.labels.iter())
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!("labels {}", labels.join(","))
        }
    }
}

/// How many nodes fetch from the store at once, cluster-wide: a pair hydrating counts, and a
/// dataset that comes through Dragonfly peers counts once however many nodes fetch it.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    limit: usize,
    fetching: BTreeSet<Target>,
    peered: BTreeSet<String>,
}

impl Budget {
    /// The hydrations under way on the daemons that answered this round.
    pub(crate) fn observe(limit: usize, holdings: &BTreeMap<String, Holding>) -> Self {
        let mut budget = Budget {
            limit,
            ..Default::default()
        };
        for (node, holding) in holdings {
            let Some(datasets) = holding.serving() else {
                continue;
            };
            for status in datasets.values().filter(|s| s.state == State::Hydrating) {
                budget.count(node, status);
            }
        }
        budget
    }

    fn count(&mut self, node: &str, status: &DatasetStatus) {
        match status.p2p {
            true => self.peered.insert(status.name.clone()),
            false => self.fetching.insert(Target {
                node: node.into(),
                dataset: status.name.clone(),
            }),
        };
    }

    pub(crate) fn in_use(&self) -> usize {
        self.fetching.len() + self.peered.len()
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Whether `node` may start fetching the dataset of `status` now; counted if so.
    pub(crate) fn try_start(&mut self, node: &str, status: &DatasetStatus) -> bool {
        let joins_peers = status.p2p && self.peered.contains(&status.name);
        if !joins_peers && self.in_use() >= self.limit {
            return false;
        }
        self.count(node, status);
        true
    }
}

/// Where one target stands after this round's calls.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Progress {
    Ready {
        snapshot: String,
    },
    Hydrating {
        done: u64,
        total: u64,
        eta: Option<Duration>,
    },
    /// Cold, waiting for the warm-up budget.
    Queued,
    /// The daemon will not warm it for this workload's pods.
    Refused(String),
    /// It needs more than the node's cache quota.
    BeyondQuota(String),
    /// Its last hydration failed; asked again.
    Failed(String),
    Unreachable(String),
}

/// A target's progress from its dataset's status (after a warm call, or without one).
pub(crate) fn progress(status: &DatasetStatus, eta: Option<Duration>) -> Progress {
    let reason = || status.reason.clone().unwrap_or_default();
    match usable(status) {
        (State::Ready, snapshot) => Progress::Ready {
            snapshot: snapshot.unwrap_or_default().into(),
        },
        (State::Hydrating, _) => {
            let progress = status.progress.clone().unwrap_or_default();
            Progress::Hydrating {
                done: progress.bytes_done,
                total: progress.bytes_total,
                eta,
            }
        }
        (State::Failed, _) if status.beyond_quota => Progress::BeyondQuota(reason()),
        (State::Failed, _) => Progress::Failed(reason()),
        (State::Absent, _) => Progress::Queued,
    }
}

/// The answer once the targets' progress is known. `held` is how long the workload has held
/// its quota; past `hold` it gives the quota back (Retry, without `requeueAfterSeconds`).
///
/// Kueue (v0.17) keeps a workload's reservation until a Retry's `requeueAfterSeconds` has
/// passed, and only then evicts it; a Retry without it is evicted at once and requeued behind
/// the workloads already waiting (by its eviction time). So the quota goes back only without
/// a delay; the nodes hydrate on, and the workload finds them warm, or nearer, when Kueue
/// reserves for it again. Each reservation holds for `hold` at most, so a workload alone in
/// its queue is evicted once per `hold`, not once per round.
pub(crate) fn conclude(
    plan: &Plan,
    progress: &BTreeMap<Target, Progress>,
    held: Duration,
    hold: Duration,
    budget: &Budget,
) -> Verdict {
    if let Some(verdict) = &plan.verdict {
        return verdict.clone();
    }
    let at = |target: &Target| format!("{} on {}", target.dataset, target.node);
    let mut ready = Vec::new();
    let mut waiting = Vec::new();
    let mut queued = Vec::new();
    for target in &plan.targets {
        match progress.get(target) {
            Some(Progress::Ready { snapshot }) => {
                let short: String = snapshot.chars().take(12).collect();
                ready.push(format!("{} (snapshot {short})", at(target)));
            }
            Some(Progress::Refused(why)) => {
                return Verdict::rejected(format!("{}: {why}", at(target)));
            }
            Some(Progress::BeyondQuota(why)) => {
                return Verdict::rejected(format!(
                    "{} cannot fit in the node's cache: {why}",
                    at(target)
                ));
            }
            Some(Progress::Hydrating {
                done,
                total,
                eta: remaining,
            }) => {
                let percent = match *total {
                    0 => 0,
                    total => done.saturating_mul(100) / total,
                };
                let mut words = format!("{} {percent}% of {}", at(target), human_bytes(*total));
                if let Some(remaining) = remaining {
                    words += &format!(", about {} s to go", remaining.as_secs());
                }
                waiting.push(words);
            }
            Some(Progress::Queued) | None => queued.push(at(target)),
            Some(Progress::Failed(why)) => {
                waiting.push(format!("{} failed, asked again: {why}", at(target)));
            }
            Some(Progress::Unreachable(why)) => waiting.push(format!("{}: {why}", at(target))),
        }
    }
    if waiting.is_empty() && queued.is_empty() {
        return Verdict {
            state: state::READY,
            message: format!("warm: {}", ready.join(", ")),
            pod_set_updates: plan.selectors.clone(),
        };
    }
    let mut parts = Vec::new();
    if !waiting.is_empty() {
        parts.push(format!("warming {}", waiting.join(", ")));
    }
    if !queued.is_empty() {
        parts.push(format!(
            "waiting for the warm-up budget ({} of {} fetches from the store under way): {}",
            budget.in_use(),
            budget.limit(),
            queued.join(", ")
        ));
    }
    if !ready.is_empty() {
        parts.push(format!("warm: {}", ready.join(", ")));
    }
    let message = parts.join("; ");
    if held < hold {
        return Verdict::pending(message);
    }
    Verdict {
        state: state::RETRY,
        message: format!(
            "not warm within the {} s a workload may hold its quota: the quota goes back to the queue, and the warm-up goes on: {message}",
            hold.as_secs()
        ),
        pod_set_updates: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::protocol::Progress as Figures;
    use serde_json::json;

    fn status(name: &str, state: State) -> DatasetStatus {
        let mut status: DatasetStatus =
            serde_json::from_value(json!({"name": name, "state": "absent"})).unwrap();
        status.state = state;
        status.snapshot = (state == State::Ready).then(|| "0123456789abcdef".into());
        status.progress = (state == State::Hydrating).then(|| Figures {
            bytes_done: 25,
            bytes_total: 100,
            ..Default::default()
        });
        status
    }

    struct Cluster {
        nodes: BTreeMap<String, NodeView>,
        holdings: BTreeMap<String, Holding>,
        flavors: BTreeMap<String, ResourceFlavorSpec>,
    }

    impl Cluster {
        /// Nodes named with what their daemon holds of `imagenet` (`None`: no daemon).
        fn new(nodes: &[(&str, Option<State>)]) -> Self {
            let mut cluster = Cluster {
                nodes: BTreeMap::new(),
                holdings: BTreeMap::new(),
                flavors: BTreeMap::new(),
            };
            for (name, held) in nodes {
                cluster.nodes.insert(
                    name.to_string(),
                    NodeView {
                        name: name.to_string(),
                        labels: [("kubernetes.io/hostname".to_string(), name.to_string())].into(),
                        daemon: held.map(|_| "10.0.0.1:7070".into()),
                        ..Default::default()
                    },
                );
                if let Some(state) = held {
                    let datasets = [("imagenet".to_string(), status("imagenet", *state))].into();
                    cluster
                        .holdings
                        .insert(name.to_string(), Holding::Serving(datasets));
                }
            }
            cluster
        }

        fn world(&self) -> World<'_> {
            World {
                nodes: &self.nodes,
                holdings: &self.holdings,
                flavors: &self.flavors,
                driver: "cache.hydrator.dev",
            }
        }
    }

    /// A reserved workload of `count` pods whose template names `datasets`.
    fn workload(datasets: &str, count: i32, topology: Option<serde_json::Value>) -> Workload {
        let mut assignment =
            json!({"name": "main", "count": count, "flavors": {"cpu": "default-flavor"}});
        if let Some(topology) = topology {
            assignment["topologyAssignment"] = topology;
        }
        serde_json::from_value(json!({
            "metadata": {"name": "w", "namespace": "team-a"},
            "spec": {"podSets": [{"name": "main", "count": count, "template": {
                "metadata": {"annotations": {"hydrator.dev/datasets": datasets}},
                "spec": {"containers": []}}}]},
            "status": {"admission": {"clusterQueue": "q", "podSetAssignments": [assignment]}}
        }))
        .unwrap()
    }

    fn nodes_of(plan: &Plan) -> Vec<&str> {
        plan.targets.iter().map(|t| t.node.as_str()).collect()
    }

    #[test]
    fn warm_nodes_are_chosen_first_then_hydrating_then_cold_and_never_one_without_a_daemon() {
        let cluster = Cluster::new(&[
            ("a-cold", Some(State::Absent)),
            ("b-none", None),
            ("c-warm", Some(State::Ready)),
            ("d-hydrating", Some(State::Hydrating)),
        ]);
        let world = cluster.world();
        assert_eq!(
            nodes_of(&plan(&workload("imagenet", 1, None), &world)),
            ["c-warm"]
        );
        let two = plan(&workload("imagenet", 2, None), &world);
        assert_eq!(nodes_of(&two), ["c-warm", "d-hydrating"]);
        let eight = plan(&workload("imagenet", 8, None), &world);
        assert_eq!(nodes_of(&eight), ["a-cold", "c-warm", "d-hydrating"]);
        assert_eq!(
            two.selectors,
            [PodSetUpdate {
                name: "main".into(),
                node_selector: [("warm.hydrator.dev/imagenet".into(), "ready".into())].into()
            }]
        );
    }

    #[test]
    fn with_tas_exactly_the_assigned_nodes_are_warmed_and_no_selector_is_added() {
        let cluster = Cluster::new(&[
            ("gpu-1", Some(State::Ready)),
            ("gpu-2", Some(State::Absent)),
            ("gpu-3", Some(State::Absent)),
        ]);
        let topology = json!({"levels": ["kubernetes.io/hostname"], "slices": [{"domainCount": 2,
            "valuesPerLevel": [{"individual": {"prefix": "gpu-", "roots": ["2", "3"]}}],
            "podCounts": {"universal": 1}}]});
        let plan = plan(&workload("imagenet", 2, Some(topology)), &cluster.world());
        assert_eq!(nodes_of(&plan), ["gpu-2", "gpu-3"]);
        assert!(plan.selectors.is_empty());
        assert!(plan.verdict.is_none());
    }

    #[test]
    fn an_unknown_dataset_is_rejected_and_none_at_all_is_ready_at_once() {
        let cluster = Cluster::new(&[("gpu-1", Some(State::Ready))]);
        let unknown = plan(&workload("imagenet,laion", 1, None), &cluster.world());
        let verdict = unknown.verdict.unwrap();
        assert_eq!(verdict.state, state::REJECTED);
        assert!(verdict.message.contains("\"laion\""), "{}", verdict.message);
        let nothing = plan(&workload("", 1, None), &cluster.world());
        assert_eq!(nothing.verdict.unwrap().state, state::READY);
    }

    #[test]
    fn no_node_that_fits_keeps_it_pending_with_the_reason() {
        let mut cluster = Cluster::new(&[("gpu-1", Some(State::Ready))]);
        cluster.flavors.insert(
            "default-flavor".into(),
            ResourceFlavorSpec {
                node_labels: [("gpu".into(), "h100".into())].into(),
                ..Default::default()
            },
        );
        let plan = plan(&workload("imagenet", 1, None), &cluster.world());
        let verdict = plan.verdict.unwrap();
        assert_eq!(verdict.state, state::PENDING);
        assert!(verdict.message.contains("gpu=h100"), "{}", verdict.message);
    }

    fn target(node: &str) -> Target {
        Target {
            node: node.into(),
            dataset: "imagenet".into(),
        }
    }

    fn planned(nodes: &[&str]) -> Plan {
        Plan {
            targets: nodes.iter().map(|n| target(n)).collect(),
            selectors: vec![PodSetUpdate {
                name: "main".into(),
                node_selector: [("warm.hydrator.dev/imagenet".into(), "ready".into())].into(),
            }],
            verdict: None,
        }
    }

    const HOLD: Duration = Duration::from_secs(600);

    #[test]
    fn ready_everywhere_is_ready_with_the_selector() {
        let plan = planned(&["gpu-1", "gpu-2"]);
        let ready = Progress::Ready {
            snapshot: "0123456789abcdef".into(),
        };
        let progress = [(target("gpu-1"), ready.clone()), (target("gpu-2"), ready)].into();
        let verdict = conclude(&plan, &progress, Duration::ZERO, HOLD, &Budget::default());
        assert_eq!(verdict.state, state::READY);
        assert_eq!(verdict.pod_set_updates, plan.selectors);
        assert!(verdict
            .message
            .contains("imagenet on gpu-2 (snapshot 0123456789ab)"));
    }

    #[test]
    fn a_warm_up_not_done_within_the_hold_gives_the_quota_back_without_a_delay() {
        let plan = planned(&["gpu-1"]);
        let hydrating = Progress::Hydrating {
            done: 10,
            total: 100,
            eta: Some(Duration::from_secs(1200)),
        };
        let progress = [(target("gpu-1"), hydrating)].into();
        let held = |secs| {
            conclude(
                &plan,
                &progress,
                Duration::from_secs(secs),
                HOLD,
                &Budget::default(),
            )
        };
        let within = held(599);
        assert_eq!(within.state, state::PENDING);
        assert!(
            within
                .message
                .contains("imagenet on gpu-1 10% of 100 B, about 1200 s to go"),
            "{}",
            within.message
        );
        let past = held(600);
        assert_eq!(past.state, state::RETRY);
        assert!(
            past.message.contains("not warm within the 600 s"),
            "{}",
            past.message
        );
        assert!(past.pod_set_updates.is_empty());
    }

    #[test]
    fn refusals_and_a_dataset_beyond_the_quota_are_rejected() {
        let plan = planned(&["gpu-1"]);
        for (progress, words) in [
            (
                Progress::Refused("team-b may not use \"imagenet\"".into()),
                "may not use",
            ),
            (
                Progress::BeyondQuota("not enough space".into()),
                "cannot fit",
            ),
        ] {
            let progress = [(target("gpu-1"), progress)].into();
            let verdict = conclude(&plan, &progress, Duration::ZERO, HOLD, &Budget::default());
            assert_eq!(verdict.state, state::REJECTED);
            assert!(verdict.message.contains(words), "{}", verdict.message);
        }
    }

    #[test]
    fn the_budget_counts_store_fetches_and_a_peered_dataset_once() {
        let mut holdings = BTreeMap::new();
        let mut peered = status("llama", State::Hydrating);
        peered.p2p = true;
        let hydrating = |n: &str| {
            let datasets = [
                ("imagenet".to_string(), status("imagenet", State::Hydrating)),
                ("llama".to_string(), peered.clone()),
            ];
            (n.to_string(), Holding::Serving(datasets.into()))
        };
        holdings.extend([hydrating("gpu-1"), hydrating("gpu-2")]);
        let mut budget = Budget::observe(4, &holdings);
        assert_eq!(
            budget.in_use(),
            3,
            "two store fetches of imagenet and llama's peers"
        );
        assert!(
            budget.try_start("gpu-3", &peered),
            "another node joins llama's peers"
        );
        assert!(budget.try_start("gpu-3", &status("imagenet", State::Absent)));
        assert_eq!(budget.in_use(), 4);
        assert!(!budget.try_start("gpu-4", &status("imagenet", State::Absent)));
        assert!(
            budget.try_start("gpu-4", &peered),
            "joining peers costs the store nothing"
        );
        let queued = conclude(
            &planned(&["gpu-4"]),
            &[(target("gpu-4"), Progress::Queued)].into(),
            Duration::ZERO,
            HOLD,
            &budget,
        );
        assert_eq!(queued.state, state::PENDING);
        assert!(
            queued.message.contains("budget (4 of 4"),
            "{}",
            queued.message
        );
    }

    #[test]
    fn a_refresh_beside_a_ready_snapshot_counts_as_ready() {
        let mut refreshing = status("imagenet", State::Hydrating);
        refreshing.held_snapshot = Some("feedfacefeedface".into());
        assert_eq!(
            progress(&refreshing, None),
            Progress::Ready {
                snapshot: "feedfacefeedface".into()
            }
        );
        let mut full = status("imagenet", State::Failed);
        full.beyond_quota = true;
        assert!(matches!(progress(&full, None), Progress::BeyondQuota(_)));
    }
}
