//! What each node says it holds: a label `warm.hydrator.dev/DATASET=ready` for every dataset
//! ready in its cache (what the scheduler, Kueue's podSetUpdates and `kubectl get nodes -L`
//! read), and the snapshots' digests in the annotation `hydrator.dev/snapshots`.
//!
//! The controller writes them, not the node daemons: the daemons keep no API credentials,
//! and a pod allowed to label its own node could label every node. Labels are written by
//! server-side apply under the controller's own field manager, so a label it stops applying
//! is removed and labels of anyone else are never touched. A node whose daemon does not
//! answer keeps its labels (its cache is still on disk); a node with no daemon loses them.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::daemons::Holding;
use crate::daemon::protocol::State;

pub(crate) const LABEL_PREFIX: &str = "warm.hydrator.dev/";
pub(crate) const SNAPSHOTS_ANNOTATION: &str = "hydrator.dev/snapshots";

/// The label key saying a node holds `dataset` ready, when the name can be a label's name
/// (at most 63 characters: letters, digits, `-`, `_`, `.`, alphanumeric at both ends).
pub(crate) fn warm_label(dataset: &str) -> Option<String> {
    let bytes = dataset.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(inner)
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric();
    valid.then(|| format!("{LABEL_PREFIX}{dataset}"))
}

/// What a node should say: its labels and its snapshots annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Warmth {
    pub labels: BTreeMap<String, String>,
    /// Dataset to the digest of its ready snapshot.
    pub snapshots: BTreeMap<String, String>,
}

/// What a node with `holding` should say; `None` to leave it as it is (its daemon did not
/// answer this round).
pub(crate) fn warmth(holding: Option<&Holding>) -> Option<Warmth> {
    let Some(holding) = holding else {
        return Some(Warmth::default());
    };
    let datasets = holding.serving()?;
    let mut warmth = Warmth::default();
    for status in datasets.values() {
        let snapshot = match (status.state, &status.held_snapshot) {
            (State::Ready, _) => status.snapshot.clone(),
            (State::Hydrating, Some(held)) => Some(held.clone()),
            _ => None,
        };
        if let Some(snapshot) = snapshot {
            if let Some(label) = warm_label(&status.name) {
                warmth.labels.insert(label, "ready".into());
            }
            warmth.snapshots.insert(status.name.clone(), snapshot);
        }
    }
    Some(warmth)
}

/// What `labels` and `annotations` (a node's) say now.
pub(crate) fn current(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Warmth {
    Warmth {
        labels: (labels.iter())
            .filter(|(key, _)| key.starts_with(LABEL_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        snapshots: (annotations.get(SNAPSHOTS_ANNOTATION))
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default(),
    }
}

/// The server-side apply body that makes node `name` say `warmth`.
pub(crate) fn patch(name: &str, warmth: &Warmth) -> Value {
    let mut metadata = json!({ "name": name, "labels": warmth.labels });
    if !warmth.snapshots.is_empty() {
        let snapshots = serde_json::to_string(&warmth.snapshots).expect("a map serializes");
        metadata["annotations"] = json!({ SNAPSHOTS_ANNOTATION: snapshots });
    }
    json!({ "apiVersion": "v1", "kind": "Node", "metadata": metadata })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::protocol::DatasetStatus;

    #[test]
    fn only_names_that_can_be_label_names_get_a_label() {
        assert_eq!(
            warm_label("imagenet-1k").as_deref(),
            Some("warm.hydrator.dev/imagenet-1k")
        );
        assert_eq!(
            warm_label("coco_2017.v2").as_deref(),
            Some("warm.hydrator.dev/coco_2017.v2")
        );
        for bad in [
            "",
            "-lead",
            "trail.",
            "has/slash",
            "spa ce",
            &"x".repeat(64),
        ] {
            assert_eq!(warm_label(bad), None, "{bad:?}");
        }
    }

    fn status(
        name: &str,
        state: State,
        snapshot: Option<&str>,
        held: Option<&str>,
    ) -> DatasetStatus {
        let mut status: DatasetStatus =
            serde_json::from_value(json!({"name": name, "state": "absent"})).unwrap();
        status.state = state;
        status.snapshot = snapshot.map(String::from);
        status.held_snapshot = held.map(String::from);
        status
    }

    #[test]
    fn ready_and_held_snapshots_are_said_and_nothing_else() {
        let datasets = [
            status("imagenet", State::Ready, Some("aaa"), None),
            status("coco", State::Hydrating, Some("bbb"), Some("ccc")),
            status("places", State::Hydrating, Some("ddd"), None),
            status("sun", State::Failed, None, None),
        ];
        let holding = Holding::Serving(datasets.into_iter().map(|s| (s.name.clone(), s)).collect());
        let warmth = warmth(Some(&holding)).unwrap();
        let labels: Vec<&str> = warmth.labels.keys().map(String::as_str).collect();
        assert_eq!(
            labels,
            ["warm.hydrator.dev/coco", "warm.hydrator.dev/imagenet"]
        );
        assert_eq!(warmth.snapshots["coco"], "ccc");
        assert_eq!(warmth.snapshots["imagenet"], "aaa");
        assert_eq!(
            super::warmth(None),
            Some(Warmth::default()),
            "no daemon: nothing is warm"
        );
        assert_eq!(
            super::warmth(Some(&Holding::Unreachable("timeout".into()))),
            None
        );
    }

    #[test]
    fn a_patch_round_trips_through_what_a_node_then_says() {
        let warmth = Warmth {
            labels: [("warm.hydrator.dev/imagenet".into(), "ready".into())].into(),
            snapshots: [("imagenet".into(), "aaa".into())].into(),
        };
        let patch = patch("gpu-1", &warmth);
        let labels = serde_json::from_value(patch["metadata"]["labels"].clone()).unwrap();
        let annotations = serde_json::from_value(patch["metadata"]["annotations"].clone()).unwrap();
        let mut other: BTreeMap<String, String> = labels;
        other.insert("kubernetes.io/hostname".into(), "gpu-1".into());
        assert_eq!(current(&other, &annotations), warmth);
    }
}
