//! Which catalog datasets a pod set needs: those its pod template names in the annotation
//! `hydrator.dev/datasets` (comma-separated), and those of its inline `csi` volumes of the
//! hydrator driver.
//!
//! The pod template, not the Job, carries the annotation: Kueue copies every job kind's pod
//! templates into the Workload, so the controller reads one place whatever the job kind
//! (batch Job, JobSet, PyTorchJob, RayJob) and needs no access to the jobs themselves.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PodTemplateSpec;

use crate::csi::DATASET_ATTRIBUTE;

pub(crate) const DATASETS_ANNOTATION: &str = "hydrator.dev/datasets";

/// The datasets `template` needs, read with `driver` as the CSI driver's name.
pub(crate) fn datasets(template: &PodTemplateSpec, driver: &str) -> BTreeSet<String> {
    let annotated = (template.metadata.as_ref())
        .and_then(|meta| meta.annotations.as_ref())
        .and_then(|annotations| annotations.get(DATASETS_ANNOTATION))
        .into_iter()
        .flat_map(|list| list.split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(String::from);
    let volumes = (template.spec.as_ref())
        .and_then(|spec| spec.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|volume| volume.csi.as_ref())
        .filter(|csi| csi.driver == driver)
        .filter_map(|csi| {
            csi.volume_attributes
                .as_ref()?
                .get(DATASET_ATTRIBUTE)
                .cloned()
        });
    annotated.chain(volumes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_annotation_and_the_drivers_volumes_name_the_datasets() {
        let template: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"annotations": {"hydrator.dev/datasets": "imagenet, coco,,"}},
            "spec": {"containers": [{"name": "t"}], "volumes": [
                {"name": "a", "csi": {"driver": "cache.hydrator.dev",
                                      "volumeAttributes": {"dataset": "places", "start": "lazy"}}},
                {"name": "b", "csi": {"driver": "other.csi.example", "volumeAttributes": {"dataset": "x"}}},
                {"name": "c", "emptyDir": {}},
                {"name": "d", "csi": {"driver": "cache.hydrator.dev"}}]}
        }))
        .unwrap();
        let names: Vec<String> = datasets(&template, "cache.hydrator.dev")
            .into_iter()
            .collect();
        assert_eq!(names, ["coco", "imagenet", "places"]);
    }

    #[test]
    fn a_template_without_either_needs_nothing() {
        assert!(datasets(&PodTemplateSpec::default(), "cache.hydrator.dev").is_empty());
    }
}
