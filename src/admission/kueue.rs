//! The parts of Kueue's v1beta2 objects the controller reads (Workload, AdmissionCheck,
//! ResourceFlavor), and the server-side-apply bodies it writes.
//!
//! Only the fields read are declared; the rest of each object is ignored when it is read,
//! and never written: every write is a server-side apply of the few fields this controller
//! owns (its check's entry of a Workload's `status.admissionChecks`, its AdmissionCheck's
//! `Active` condition), so it cannot undo what Kueue or anyone else wrote meanwhile.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodTemplateSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub(crate) const GROUP: &str = "kueue.x-k8s.io";
pub(crate) const VERSION: &str = "v1beta2";
const API_VERSION: &str = "kueue.x-k8s.io/v1beta2";

/// Declares a Kueue kind as a Kubernetes resource, so kube's API and watchers take it.
macro_rules! kueue_resource {
    ($kind:ident, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $kind {
            const API_VERSION: &'static str = API_VERSION;
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = stringify!($kind);
            const VERSION: &'static str = VERSION;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }
        impl k8s_openapi::Metadata for $kind {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct Workload {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WorkloadSpec,
    #[serde(default)]
    pub status: Option<WorkloadStatus>,
}
kueue_resource!(Workload, "workloads", k8s_openapi::NamespaceResourceScope);

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkloadSpec {
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct PodSet {
    #[serde(default = "main_pod_set")]
    pub name: String,
    #[serde(default)]
    pub template: PodTemplateSpec,
    #[serde(default)]
    pub count: i32,
}

fn main_pod_set() -> String {
    "main".into()
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkloadStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub admission: Option<Admission>,
    #[serde(default)]
    pub admission_checks: Vec<AdmissionCheckState>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Admission {
    #[serde(default)]
    pub cluster_queue: String,
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodSetAssignment {
    pub name: String,
    /// Resource name to the ResourceFlavor assigned for it.
    #[serde(default)]
    pub flavors: BTreeMap<String, String>,
    #[serde(default)]
    pub count: Option<i32>,
    #[serde(default)]
    pub topology_assignment: Option<TopologyAssignment>,
}

/// Where Topology-Aware Scheduling put a pod set's pods (v1beta2's compressed form).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TopologyAssignment {
    #[serde(default)]
    pub levels: Vec<String>,
    #[serde(default)]
    pub slices: Vec<TopologySlice>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TopologySlice {
    pub domain_count: usize,
    #[serde(default)]
    pub values_per_level: Vec<LevelValues>,
}

/// One level's values in a slice: one for every domain, or one per domain.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct LevelValues {
    #[serde(default)]
    pub universal: Option<String>,
    #[serde(default)]
    pub individual: Option<IndividualValues>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct IndividualValues {
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub roots: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionCheckState {
    pub name: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub last_transition_time: Option<Time>,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_set_updates: Vec<PodSetUpdate>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodSetUpdate {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct AdmissionCheck {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: AdmissionCheckSpec,
    #[serde(default)]
    pub status: Option<ConditionsStatus>,
}
kueue_resource!(
    AdmissionCheck,
    "admissionchecks",
    k8s_openapi::ClusterResourceScope
);

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionCheckSpec {
    #[serde(default)]
    pub controller_name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct ConditionsStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct ResourceFlavor {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ResourceFlavorSpec,
}
kueue_resource!(
    ResourceFlavor,
    "resourceflavors",
    k8s_openapi::ClusterResourceScope
);

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResourceFlavorSpec {
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub node_taints: Vec<Taint>,
}

/// The states of a check, as Kueue spells them.
pub(crate) mod state {
    pub(crate) const PENDING: &str = "Pending";
    pub(crate) const READY: &str = "Ready";
    pub(crate) const RETRY: &str = "Retry";
    pub(crate) const REJECTED: &str = "Rejected";
}

impl Workload {
    fn condition(&self, kind: &str) -> Option<&Condition> {
        let status = self.status.as_ref()?;
        status.conditions.iter().find(|c| c.type_ == kind)
    }

    fn condition_true(&self, kind: &str) -> bool {
        self.condition(kind).is_some_and(|c| c.status == "True")
    }

    /// When Kueue reserved quota for it, if it holds a reservation a check should act on:
    /// not yet admitted, not being evicted, not finished.
    pub(crate) fn reserved_since(&self) -> Option<&Time> {
        let reserved = self
            .condition("QuotaReserved")
            .filter(|c| c.status == "True")?;
        let idle = ["Admitted", "Evicted", "Finished"];
        match idle.iter().any(|kind| self.condition_true(kind)) {
            true => None,
            false => Some(&reserved.last_transition_time),
        }
    }

    pub(crate) fn check(&self, name: &str) -> Option<&AdmissionCheckState> {
        let status = self.status.as_ref()?;
        status.admission_checks.iter().find(|c| c.name == name)
    }

    pub(crate) fn assignment(&self, pod_set: &str) -> Option<&PodSetAssignment> {
        let admission = self.status.as_ref()?.admission.as_ref()?;
        admission
            .pod_set_assignments
            .iter()
            .find(|a| a.name == pod_set)
    }

    /// `namespace/name`, for messages and logs.
    pub(crate) fn key(&self) -> String {
        let namespace = self.metadata.namespace.as_deref().unwrap_or_default();
        let name = self.metadata.name.as_deref().unwrap_or_default();
        format!("{namespace}/{name}")
    }
}

impl AdmissionCheck {
    /// Whether its `Active` condition is already the one this controller sets.
    pub(crate) fn active(&self) -> bool {
        let conditions = self.status.as_ref().map(|s| s.conditions.as_slice());
        conditions.unwrap_or_default().iter().any(|c| {
            c.type_ == "Active"
                && c.status == "True"
                && c.observed_generation == self.metadata.generation
        })
    }
}

/// The server-side apply body of one check's entry in a Workload's status.
pub(crate) fn check_state_patch(workload: &Workload, state: &AdmissionCheckState) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload.metadata.name,
            "namespace": workload.metadata.namespace,
        },
        "status": { "admissionChecks": [state] },
    })
}

/// The server-side apply body saying this controller serves the AdmissionCheck.
pub(crate) fn active_patch(check: &AdmissionCheck, message: &str, now: &Time) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": { "name": check.metadata.name },
        "status": { "conditions": [{
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": message,
            "lastTransitionTime": now,
            "observedGeneration": check.metadata.generation,
        }]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Workload as Kueue v0.17 writes it, quota reserved, the check pending.
    pub(crate) fn reserved_workload() -> Workload {
        serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "job-train-1a2b3", "namespace": "team-a", "generation": 1},
            "spec": {"podSets": [{"name": "main", "count": 2, "template": {"spec": {
                "containers": [{"name": "trainer", "image": "trainer"}]}}}]},
            "status": {
                "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                                "message": "Quota reserved in ClusterQueue team-a",
                                "lastTransitionTime": "2026-12-06T10:00:00Z"}],
                "admission": {"clusterQueue": "team-a", "podSetAssignments": [
                    {"name": "main", "count": 2, "flavors": {"cpu": "default-flavor"},
                     "resourceUsage": {"cpu": "2"}}]},
                "admissionChecks": [{"name": "prewarm", "state": "Pending", "message": "",
                                     "lastTransitionTime": "2026-12-06T10:00:00Z"}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_reserved_workload_is_read_with_its_check_and_assignment() {
        let workload = reserved_workload();
        assert!(workload.reserved_since().is_some());
        assert_eq!(workload.check("prewarm").unwrap().state, state::PENDING);
        assert_eq!(workload.assignment("main").unwrap().count, Some(2));
        assert_eq!(workload.key(), "team-a/job-train-1a2b3");
    }

    #[test]
    fn an_admitted_or_evicted_workload_is_left_alone() {
        for kind in ["Admitted", "Evicted", "Finished"] {
            let mut workload = reserved_workload();
            let status = workload.status.as_mut().unwrap();
            let mut condition = status.conditions[0].clone();
            condition.type_ = kind.into();
            status.conditions.push(condition);
            assert!(workload.reserved_since().is_none(), "{kind}");
        }
    }

    #[test]
    fn the_check_patch_names_only_the_checks_entry() {
        let workload = reserved_workload();
        let state = AdmissionCheckState {
            name: "prewarm".into(),
            state: state::READY.into(),
            message: "ready".into(),
            pod_set_updates: vec![PodSetUpdate {
                name: "main".into(),
                node_selector: [("warm.hydrator.dev/imagenet".into(), "ready".into())].into(),
            }],
            ..Default::default()
        };
        let patch = check_state_patch(&workload, &state);
        assert_eq!(patch["metadata"]["namespace"], "team-a");
        let entry = &patch["status"]["admissionChecks"][0];
        assert_eq!(
            entry["podSetUpdates"][0]["nodeSelector"]["warm.hydrator.dev/imagenet"],
            "ready"
        );
        assert!(
            entry.get("requeueAfterSeconds").is_none(),
            "a Retry is never delayed"
        );
        assert_eq!(patch["status"].as_object().unwrap().len(), 1);
    }
}
