//! Which pods may mount a dataset through the CSI driver. A dataset may name the namespaces
//! (`namespaces`) and the service accounts (`service_accounts`, as `NAMESPACE/NAME`) whose pods
//! may mount it; `[access]` gives the same for every dataset that names none.
//!
//! Default deny: once the catalog sets any rule (a dataset's or `[access]`), a dataset that has
//! none of its own and no `[access]` to fall back on is closed to every pod. With no rule at
//! all, every pod may mount every dataset and the catalog alone is the gate.
//!
//! Only the CSI plugin says which pod asks (the kubelet gives it the pod's namespace and service
//! account with `podInfoOnMount`); callers on the socket or with a token keep their own dataset
//! scopes ([`super::identity`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Deserialize;

use super::protocol::PodIdentity;

/// A dataset's rules, or `[access]`, as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRules {
    pub namespaces: Option<Vec<String>>,
    pub service_accounts: Option<Vec<String>>,
}

impl RawRules {
    pub(crate) fn is_set(&self) -> bool {
        self.namespaces.is_some() || self.service_accounts.is_some()
    }
}

/// Where a dataset's rules come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Dataset,
    Default,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rules {
    namespaces: BTreeSet<String>,
    service_accounts: BTreeSet<String>,
    origin: Origin,
}

/// Who may mount one dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The catalog sets no rule: every pod.
    Open,
    Rules(Arc<Rules>),
    /// Rules are set elsewhere in the catalog, none for this dataset and no `[access]`.
    Closed,
}

/// Checks `raw` (of `field`, e.g. `dataset "x"` or `access`), reporting each bad name.
pub(crate) fn rules(raw: &RawRules, field: &str, problems: &mut Vec<String>) -> Rules {
    let mut check = |list: &Option<Vec<String>>, key: &str, valid: fn(&str) -> bool| {
        let mut names = BTreeSet::new();
        for name in list.iter().flatten() {
            match valid(name) {
                true => {
                    names.insert(name.clone());
                }
                false => problems.push(format!("{field}: {key} {name:?} is not {}", what(key))),
            }
        }
        names
    };
    Rules {
        namespaces: check(&raw.namespaces, "namespaces", is_label),
        service_accounts: check(
            &raw.service_accounts,
            "service_accounts",
            is_service_account,
        ),
        origin: Origin::Dataset,
    }
}

fn what(key: &str) -> &'static str {
    match key {
        "namespaces" => "a namespace name (a DNS label: a-z, 0-9, '-')",
        _ => "NAMESPACE/NAME of a service account",
    }
}

/// A Kubernetes namespace name: a DNS-1123 label.
fn is_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// `NAMESPACE/NAME`, the name a DNS-1123 subdomain.
fn is_service_account(text: &str) -> bool {
    let Some((namespace, name)) = text.split_once('/') else {
        return false;
    };
    is_label(namespace) && (1..=253).contains(&name.len()) && name.split('.').all(is_label)
}

/// Each dataset's access: its own rules, else `[access]`, else open or closed as the catalog
/// sets rules anywhere or not.
pub(crate) fn resolve(own: Option<Rules>, default: Option<&Arc<Rules>>, any: bool) -> Access {
    match (own, default) {
        (Some(own), _) => Access::Rules(Arc::new(own)),
        (None, Some(default)) => Access::Rules(default.clone()),
        (None, None) if any => Access::Closed,
        (None, None) => Access::Open,
    }
}

impl Rules {
    pub(crate) fn into_default(mut self) -> Self {
        self.origin = Origin::Default;
        self
    }
}

/// Why a pod may not mount a dataset: the message names the dataset, the pod's namespace and
/// service account, and the rule that applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error(
        "{pod} may not mount dataset {dataset}: the catalog sets access rules, none for \
         {dataset}, and no [access] default (default deny)"
    )]
    DefaultDeny { pod: Pod, dataset: String },
    #[error(
        "{pod} may not mount dataset {dataset}: {} allows namespaces {:?} and service accounts \
         {:?}",
        whose(.rules.origin, dataset),
        .rules.namespaces,
        .rules.service_accounts
    )]
    NotAllowed {
        pod: Pod,
        dataset: String,
        rules: Arc<Rules>,
    },
}

/// A pod as a refusal names it.
#[derive(Debug)]
pub(crate) struct Pod(PodIdentity);

impl std::fmt::Display for Pod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pods of namespace {:?} (service account {:?})",
            self.0.namespace, self.0.service_account
        )
    }
}

/// The rule that applied, as a refusal names it.
fn whose(origin: Origin, dataset: &str) -> String {
    match origin {
        Origin::Dataset => format!("dataset {dataset}'s rule"),
        Origin::Default => "the catalog's [access] default".to_string(),
    }
}

impl Access {
    /// Whether `pod` may mount `dataset`.
    pub(crate) fn check(&self, dataset: &str, pod: &PodIdentity) -> Result<(), Refused> {
        let rules = match self {
            Access::Open => return Ok(()),
            Access::Closed => {
                return Err(Refused::DefaultDeny {
                    pod: Pod(pod.clone()),
                    dataset: dataset.to_string(),
                })
            }
            Access::Rules(rules) => rules,
        };
        let account = format!("{}/{}", pod.namespace, pod.service_account);
        if rules.namespaces.contains(&pod.namespace) || rules.service_accounts.contains(&account) {
            return Ok(());
        }
        Err(Refused::NotAllowed {
            pod: Pod(pod.clone()),
            dataset: dataset.to_string(),
            rules: rules.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str, service_account: &str) -> PodIdentity {
        PodIdentity {
            namespace: namespace.into(),
            service_account: service_account.into(),
        }
    }

    fn raw(namespaces: &[&str], service_accounts: &[&str]) -> RawRules {
        let list = |names: &[&str]| Some(names.iter().map(|n| n.to_string()).collect());
        RawRules {
            namespaces: list(namespaces),
            service_accounts: list(service_accounts),
        }
    }

    #[test]
    fn a_pod_is_let_in_by_its_namespace_or_its_service_account() {
        let mut problems = Vec::new();
        let own = rules(&raw(&["team-a"], &["research/trainer"]), "d", &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let access = resolve(Some(own), None, true);
        assert!(access.check("imagenet", &pod("team-a", "default")).is_ok());
        assert!(access
            .check("imagenet", &pod("research", "trainer"))
            .is_ok());
        let refused = access
            .check("imagenet", &pod("research", "default"))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("dataset imagenet"), "{refused}");
        assert!(refused.contains("\"research\""), "{refused}");
        assert!(refused.contains("imagenet's rule"), "{refused}");
        assert!(refused.contains("research/trainer"), "{refused}");
    }

    #[test]
    fn the_default_applies_to_datasets_without_rules_and_without_it_they_are_closed() {
        let mut problems = Vec::new();
        let default =
            Arc::new(rules(&raw(&["shared"], &[]), "access", &mut problems).into_default());
        let access = resolve(None, Some(&default), true);
        assert!(access.check("coco", &pod("shared", "x")).is_ok());
        let refused = access
            .check("coco", &pod("team-a", "x"))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("[access] default"), "{refused}");

        let closed = resolve(None, None, true);
        let refused = closed
            .check("coco", &pod("shared", "x"))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("default deny"), "{refused}");
        assert_eq!(resolve(None, None, false), Access::Open);
        assert!(Access::Open.check("coco", &pod("", "")).is_ok());
    }

    #[test]
    fn names_that_kubernetes_would_not_give_are_problems() {
        let mut problems = Vec::new();
        rules(
            &raw(&["Team", "-a", "ok"], &["no-slash", "ns/UPPER", "ns/a.b-c"]),
            "dataset \"d\"",
            &mut problems,
        );
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("\"Team\""), "{problems:?}");
    }
}
