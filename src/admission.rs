//! `hydrator admission`: the controller of a Kueue AdmissionCheck (`controllerName:
//! hydrator.dev/prewarm`) that warms a Workload's datasets on the nodes its pods will run on
//! while Kueue holds the Job suspended, so no GPU waits for data and `waitForPodsReady`
//! never evicts a job for it; and that labels each node with the datasets it holds ready.
//!
//! It works in rounds over the whole cluster, not one reconcile per Workload: the warm-up
//! budget (how many nodes fetch from the store at once) is shared by every workload, and the
//! nodes' holdings are asked of their daemons once per round for all of them. Watches
//! (kube's reflectors) keep Workloads, AdmissionChecks, ResourceFlavors, Nodes and the
//! daemons' pods in memory; a change to any starts a round early. What to answer is decided
//! by pure functions ([`decide`]); this module fetches, calls and writes.
//!
//! Every write is a server-side apply under the field manager `hydrator-admission` of the
//! few fields the controller owns: its check's entry in a Workload's status, its
//! AdmissionChecks' `Active` condition, and the warm labels of nodes.

mod daemons;
mod decide;
mod kueue;
mod labels;
mod nodes;
mod topology;
mod wants;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{future, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use self::daemons::{Daemons, Holding, Warmed};
use self::decide::{Budget, Plan, Progress, Target, Verdict, World};
use self::kueue::{AdmissionCheck, AdmissionCheckState, ResourceFlavor, Workload};
use crate::cli::AdmissionArgs;
use crate::daemon::protocol::{DatasetStatus, PodIdentity, State};
use crate::error::{Exit, SyncError, UsageError};

const FIELD_MANAGER: &str = "hydrator-admission";
/// A round starts at most this often, however many changes the watches see.
const MIN_GAP: Duration = Duration::from_secs(1);
/// A Pending check whose message alone changes (progress) is written at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Why an API call failed; logged, and the round goes on.
#[derive(Debug, thiserror::Error)]
enum ApiError {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

pub(crate) async fn run(args: AdmissionArgs) -> Result<Exit, SyncError> {
    let token = std::fs::read_to_string(&args.token_file)
        .map_err(|e| UsageError::new(format!("--token-file {}: {e}", args.token_file.display())))?;
    let client = Client::try_default().await.map_err(|e| {
        UsageError::new(format!(
            "no Kubernetes API to talk to (in a pod, its service account; elsewhere, KUBECONFIG): {e}"
        ))
    })?;
    let mut stop = crate::signals::stop_on_signals();
    let changed = Arc::new(Notify::new());
    let daemon_pods = watcher::Config::default().labels(&args.daemon_selector);
    let caches = Caches {
        workloads: watch(Api::all(client.clone()), Default::default(), &changed),
        checks: watch(Api::all(client.clone()), Default::default(), &changed),
        flavors: watch(Api::all(client.clone()), Default::default(), &changed),
        nodes: watch(Api::all(client.clone()), Default::default(), &changed),
        daemons: watch(
            Api::namespaced(client.clone(), &args.daemon_namespace),
            daemon_pods,
            &changed,
        ),
    };
    tracing::info!(
        controller = %args.controller_name,
        "waiting for the first listing of Workloads, AdmissionChecks, ResourceFlavors, Nodes and the daemons' pods"
    );
    tokio::select! {
        _ = caches.ready() => {}
        _ = stop.changed() => return Ok(Exit::Stopped),
    }
    tracing::info!(
        "serving AdmissionChecks of controllerName {}",
        args.controller_name
    );
    let mut controller = Controller {
        daemons: Daemons::new(token.trim().to_string()),
        hold: Duration::from_secs(args.hold_seconds),
        args,
        client,
        caches,
        seen: HashMap::new(),
        written: HashMap::new(),
    };
    loop {
        controller.round().await;
        let interval = Duration::from_secs(controller.args.interval_seconds);
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => break,
        }
        tokio::time::sleep(MIN_GAP).await;
    }
    tracing::info!("stopped");
    Ok(Exit::Success)
}

/// Keeps every `K` that `api` lists in a store, and wakes `changed` on each change.
fn watch<K>(api: Api<K>, config: watcher::Config, changed: &Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let changed = changed.clone();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::warn!("watching {kind}s: {e}"),
            }
        }
    });
    reader
}

struct Caches {
    workloads: Store<Workload>,
    checks: Store<AdmissionCheck>,
    flavors: Store<ResourceFlavor>,
    nodes: Store<Node>,
    daemons: Store<Pod>,
}

impl Caches {
    async fn ready(&self) {
        let _ = futures::join!(
            self.workloads.wait_until_ready(),
            self.checks.wait_until_ready(),
            self.flavors.wait_until_ready(),
            self.nodes.wait_until_ready(),
            self.daemons.wait_until_ready(),
        );
    }
}

struct Controller {
    args: AdmissionArgs,
    client: Client,
    caches: Caches,
    daemons: Daemons,
    hold: Duration,
    /// When each hydrating target was first seen, and its bytes then: its pace, for an ETA.
    seen: HashMap<Target, (Instant, u64)>,
    /// When each waiting workload's check was last written (`namespace/name/check`); a
    /// workload that no longer waits is forgotten.
    written: HashMap<String, Instant>,
}

impl Controller {
    async fn round(&mut self) {
        let nodes = self.caches.nodes.state();
        let daemon_pods = self.caches.daemons.state();
        let views = nodes::views(&nodes, &daemon_pods, self.args.daemon_port);
        let holdings = self.holdings(&views).await;
        self.label_nodes(&nodes, &holdings).await;
        let ours = self.activate_checks().await;
        let flavors = (self.caches.flavors.state().iter())
            .filter_map(|f| Some((f.metadata.name.clone()?, f.spec.clone())))
            .collect();
        self.forget_finished(&holdings);
        let driver = self.args.driver_name.clone();
        let world = World {
            nodes: &views,
            holdings: &holdings,
            flavors: &flavors,
            driver: &driver,
        };
        let mut budget = Budget::observe(self.args.warm_budget as usize, &holdings);
        let mut waiting: Vec<(Timestamp, Arc<Workload>, String)> = Vec::new();
        for workload in self.caches.workloads.state() {
            let Some(since) = workload.reserved_since().map(|t| t.0) else {
                continue;
            };
            for check in &ours {
                let pending = workload.check(check).map(|c| c.state.as_str());
                if pending == Some(kueue::state::PENDING) {
                    waiting.push((since, workload.clone(), check.clone()));
                }
            }
        }
        // The oldest reservation first: it takes the warm-up budget first.
        waiting.sort_by_key(|(since, workload, _)| (*since, workload.key()));
        let keys: HashSet<String> = (waiting.iter())
            .map(|(_, workload, check)| written_key(workload, check))
            .collect();
        self.written.retain(|key, _| keys.contains(key));
        for (since, workload, check) in waiting {
            let held = Timestamp::now().as_second() - since.as_second();
            let held = Duration::from_secs(held.max(0) as u64);
            let plan = decide::plan(&workload, &world);
            let progress = self.advance(&workload, &plan, &world, &mut budget).await;
            let verdict = decide::conclude(&plan, &progress, held, self.hold, &budget);
            self.answer(&workload, &check, verdict).await;
        }
    }

    /// What every node's daemon holds, asked of all at once.
    async fn holdings(
        &self,
        views: &BTreeMap<String, nodes::NodeView>,
    ) -> BTreeMap<String, Holding> {
        let asks = views.values().filter_map(|view| {
            let address = view.daemon.clone()?;
            let daemons = self.daemons.clone();
            Some(async move {
                let holding = match daemons.datasets(&address).await {
                    Ok(list) => {
                        Holding::Serving(list.into_iter().map(|s| (s.name.clone(), s)).collect())
                    }
                    Err(e) => {
                        tracing::warn!(node = %view.name, "{e}");
                        Holding::Unreachable(e.to_string())
                    }
                };
                (view.name.clone(), holding)
            })
        });
        future::join_all(asks).await.into_iter().collect()
    }

    /// Makes each node's warm labels say what its daemon holds.
    async fn label_nodes(&self, nodes: &[Arc<Node>], holdings: &BTreeMap<String, Holding>) {
        let api: Api<Node> = Api::all(self.client.clone());
        for node in nodes {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let Some(wanted) = labels::warmth(holdings.get(name)) else {
                continue;
            };
            let now = labels::current(
                node.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                node.metadata
                    .annotations
                    .as_ref()
                    .unwrap_or(&BTreeMap::new()),
            );
            if now == wanted {
                continue;
            }
            let patch = labels::patch(name, &wanted);
            match apply(&api, name, &patch, false).await {
                Ok(()) => tracing::info!(
                    node = name,
                    "warm labels: {:?}",
                    wanted.labels.keys().collect::<Vec<_>>()
                ),
                Err(e) => tracing::warn!("{e}"),
            }
        }
    }

    /// Says `Active` on every AdmissionCheck of this controller's name that does not yet;
    /// returns their names.
    async fn activate_checks(&self) -> Vec<String> {
        let api: Api<AdmissionCheck> = Api::all(self.client.clone());
        let mut ours = Vec::new();
        for check in self.caches.checks.state() {
            if check.spec.controller_name != self.args.controller_name {
                continue;
            }
            let Some(name) = check.metadata.name.clone() else {
                continue;
            };
            if !check.active() {
                let message =
                    "hydrator admission warms the datasets of workloads before they start";
                let patch = kueue::active_patch(&check, message, &Time(Timestamp::now()));
                match apply(&api, &name, &patch, true).await {
                    Ok(()) => tracing::info!(check = %name, "AdmissionCheck is Active"),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            ours.push(name);
        }
        ours
    }

    /// Forgets the pace of targets no longer hydrating.
    fn forget_finished(&mut self, holdings: &BTreeMap<String, Holding>) {
        self.seen.retain(|target, _| {
            let holding = holdings.get(&target.node).and_then(Holding::serving);
            let status = holding.and_then(|datasets| datasets.get(&target.dataset));
            status.is_some_and(|s| s.state == State::Hydrating)
        });
    }

    /// Asks the daemons of `plan`'s targets to warm them (the cold ones only within the
    /// budget), on behalf of the workload's pods, and says where each stands.
    async fn advance(
        &mut self,
        workload: &Workload,
        plan: &Plan,
        world: &World<'_>,
        budget: &mut Budget,
    ) -> BTreeMap<Target, Progress> {
        let mut progress = BTreeMap::new();
        if plan.verdict.is_some() {
            return progress;
        }
        let mut calls = Vec::new();
        for target in &plan.targets {
            let (status, address) = match (world.status(target), &world.nodes[&target.node].daemon)
            {
                (Ok(status), Some(address)) => (status, address.clone()),
                (Err(nothing), _) => {
                    progress.insert(target.clone(), nothing);
                    continue;
                }
                (Ok(_), None) => unreachable!("a node has holdings only when its daemon answers"),
            };
            let starts_cold = matches!(status.state, State::Absent | State::Failed);
            if status.beyond_quota {
                progress.insert(target.clone(), decide::progress(status, None));
            } else if starts_cold && !budget.try_start(&target.node, status) {
                progress.insert(target.clone(), Progress::Queued);
            } else {
                let pod = pod_identity(workload, &target.dataset, world.driver);
                let daemons = self.daemons.clone();
                calls.push(async move {
                    let warmed = daemons.warm(&address, &target.dataset, pod).await;
                    (target, warmed)
                });
            }
        }
        for (target, warmed) in future::join_all(calls).await {
            let step = match warmed {
                Ok(Warmed::Status(status)) => {
                    let eta = self.eta(target, &status);
                    decide::progress(&status, eta)
                }
                Ok(Warmed::Refused(why)) => Progress::Refused(why),
                Err(e) => Progress::Unreachable(e.to_string()),
            };
            progress.insert(target.clone(), step);
        }
        progress
    }

    /// How long `target` should take yet, from its pace since it was first seen hydrating.
    fn eta(&mut self, target: &Target, status: &DatasetStatus) -> Option<Duration> {
        let figures = status
            .progress
            .as_ref()
            .filter(|_| status.state == State::Hydrating)?;
        let now = Instant::now();
        let (first, done_then) = *self
            .seen
            .entry(target.clone())
            .or_insert((now, figures.bytes_done));
        let elapsed = now.duration_since(first);
        let gained = figures.bytes_done.saturating_sub(done_then);
        if elapsed < Duration::from_secs(3) || gained == 0 || figures.bytes_total == 0 {
            return None;
        }
        let left = figures.bytes_total.saturating_sub(figures.bytes_done);
        Some(elapsed.mul_f64(left as f64 / gained as f64))
    }

    /// Writes `verdict` as the check's state, when it says something new.
    async fn answer(&mut self, workload: &Workload, check: &str, verdict: Verdict) {
        let current = workload.check(check);
        let state_changed = current.map(|c| c.state.as_str()) != Some(verdict.state);
        let entry = AdmissionCheckState {
            name: check.to_string(),
            state: verdict.state.to_string(),
            last_transition_time: match (state_changed, current) {
                (false, Some(current)) if current.last_transition_time.is_some() => {
                    current.last_transition_time.clone()
                }
                _ => Some(Time(Timestamp::now())),
            },
            message: truncate(&verdict.message, 32_000),
            pod_set_updates: verdict.pod_set_updates,
        };
        let same = current.is_some_and(|c| {
            c.message == entry.message && c.pod_set_updates == entry.pod_set_updates
        });
        let key = written_key(workload, check);
        let recently = (self.written.get(&key)).is_some_and(|at| at.elapsed() < PROGRESS_EVERY);
        if !state_changed && (same || recently) {
            return;
        }
        let namespace = workload.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<Workload> = Api::namespaced(self.client.clone(), namespace);
        let name = workload.metadata.name.as_deref().unwrap_or_default();
        let patch = kueue::check_state_patch(workload, &entry);
        match apply(&api, name, &patch, true).await {
            Ok(()) => {
                self.written.insert(key, Instant::now());
                if state_changed {
                    tracing::info!(workload = %workload.key(), check, state = entry.state, "{}", entry.message);
                }
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

/// The key of [`Controller::written`].
fn written_key(workload: &Workload, check: &str) -> String {
    format!("{}/{check}", workload.key())
}

/// Who the pods of `workload` that mount `dataset` are, for the daemon's access rules: the
/// workload's namespace and that pod set's service account.
fn pod_identity(workload: &Workload, dataset: &str, driver: &str) -> PodIdentity {
    let pod_set = (workload.spec.pod_sets.iter())
        .find(|set| wants::datasets(&set.template, driver).contains(dataset));
    let service_account = (pod_set.and_then(|set| set.template.spec.as_ref()))
        .and_then(|spec| spec.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    PodIdentity {
        namespace: workload.metadata.namespace.clone().unwrap_or_default(),
        service_account,
    }
}

fn truncate(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

async fn apply<K>(
    api: &Api<K>,
    name: &str,
    patch: &serde_json::Value,
    status: bool,
) -> Result<(), ApiError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let patch = Patch::Apply(patch);
    let result = match status {
        true => api.patch_status(name, &params, &patch).await,
        false => api.patch(name, &params, &patch).await,
    };
    let kind = K::kind(&K::DynamicType::default()).to_string();
    result.map(drop).map_err(|source| ApiError::Kube {
        what: format!(
            "applying {kind} {name}{}",
            if status { "/status" } else { "" }
        ),
        source,
    })
}
