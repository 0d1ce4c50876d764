//! The hostnames in a Topology-Aware-Scheduling assignment: with TAS, Kueue has picked the
//! exact nodes before any check runs, so those are the nodes to warm.
//!
//! Kueue v1beta2 writes the assignment compressed: slices of domains whose value at each
//! level is one for all (`universal`) or one per domain (`individual`: `prefix + root +
//! suffix`). When the topology's lowest level is `kubernetes.io/hostname`, only that level is
//! written.

use super::kueue::TopologyAssignment;

pub(crate) const HOSTNAME_LEVEL: &str = "kubernetes.io/hostname";

/// The values of the `kubernetes.io/hostname` level, one per domain, or `None` when the
/// assignment stops above single nodes (a rack, a block): then the nodes are not known.
pub(crate) fn hostnames(assignment: &TopologyAssignment) -> Option<Vec<String>> {
    let level = assignment.levels.iter().position(|l| l == HOSTNAME_LEVEL)?;
    let mut hostnames = Vec::new();
    for slice in &assignment.slices {
        let values = slice.values_per_level.get(level)?;
        for domain in 0..slice.domain_count {
            let value = match (&values.universal, &values.individual) {
                (Some(universal), _) => universal.clone(),
                (None, Some(individual)) => format!(
                    "{}{}{}",
                    individual.prefix.as_deref().unwrap_or_default(),
                    individual.roots.get(domain)?,
                    individual.suffix.as_deref().unwrap_or_default()
                ),
                (None, None) => return None,
            };
            hostnames.push(value);
        }
    }
    hostnames.sort();
    hostnames.dedup();
    Some(hostnames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn assignment(value: serde_json::Value) -> TopologyAssignment {
        serde_json::from_value(value).unwrap()
    }

    /// Kueue's own examples 3 and 4 (`apis/kueue/v1beta2/workload_types.go`): six nodes, by a
    /// common prefix in one slice and by two slices.
    #[test]
    fn kueues_documented_examples_decode_to_their_nodes() {
        let one_slice = assignment(json!({
            "levels": ["kubernetes.io/hostname"],
            "slices": [{"domainCount": 6, "valuesPerLevel": [{"individual": {
                "prefix": "block-1-rack-",
                "roots": ["1-node-1", "1-node-2", "1-node-3", "1-node-4", "2-node-1", "2-node-2"]}}],
                "podCounts": {"universal": 1}}]
        }));
        let two_slices = assignment(json!({
            "levels": ["kubernetes.io/hostname"],
            "slices": [
                {"domainCount": 4, "valuesPerLevel": [{"individual": {
                    "prefix": "block-1-rack-1-node-", "roots": ["1", "2", "3", "4"]}}],
                 "podCounts": {"universal": 1}},
                {"domainCount": 2, "valuesPerLevel": [{"individual": {
                    "prefix": "block-1-rack-2-node-", "roots": ["1", "2"]}}],
                 "podCounts": {"universal": 1}}]
        }));
        let expected: Vec<String> = [
            "block-1-rack-1-node-1",
            "block-1-rack-1-node-2",
            "block-1-rack-1-node-3",
            "block-1-rack-1-node-4",
            "block-1-rack-2-node-1",
            "block-1-rack-2-node-2",
        ]
        .map(String::from)
        .into();
        assert_eq!(hostnames(&one_slice), Some(expected.clone()));
        assert_eq!(hostnames(&two_slices), Some(expected));
    }

    #[test]
    fn a_universal_value_and_a_suffix_are_honoured() {
        let universal = assignment(json!({
            "levels": ["kubernetes.io/hostname"],
            "slices": [{"domainCount": 1, "valuesPerLevel": [{"universal": "gpu-7"}],
                        "podCounts": {"universal": 8}}]
        }));
        assert_eq!(hostnames(&universal), Some(vec!["gpu-7".to_string()]));
        let suffixed = assignment(json!({
            "levels": ["kubernetes.io/hostname"],
            "slices": [{"domainCount": 2, "valuesPerLevel": [{"individual": {
                "prefix": "gpu-", "suffix": ".dc1", "roots": ["1", "2"]}}],
                "podCounts": {"individual": [3, 5]}}]
        }));
        assert_eq!(
            hostnames(&suffixed),
            Some(vec!["gpu-1.dc1".to_string(), "gpu-2.dc1".to_string()])
        );
    }

    #[test]
    fn an_assignment_to_racks_names_no_node() {
        let racks = assignment(json!({
            "levels": ["cloud.provider.com/topology-block", "cloud.provider.com/topology-rack"],
            "slices": [{"domainCount": 2, "valuesPerLevel": [
                {"universal": "block-1"}, {"individual": {"roots": ["rack-1", "rack-2"]}}],
                "podCounts": {"individual": [4, 2]}}]
        }));
        assert_eq!(hostnames(&racks), None);
    }

    #[test]
    fn a_malformed_slice_names_no_node() {
        let short = assignment(json!({
            "levels": ["kubernetes.io/hostname"],
            "slices": [{"domainCount": 3, "valuesPerLevel": [{"individual": {"roots": ["a", "b"]}}],
                        "podCounts": {"universal": 1}}]
        }));
        assert_eq!(hostnames(&short), None);
    }
}
