//! Which namespace the operator runs in. Upstream's Deployment sets
//! `OPERATOR_NAMESPACE` from the pod's own namespace; older manifests set
//! `POD_NAMESPACE`; a pod without either still has its service account's
//! namespace file.

/// Where a service account's namespace is mounted in every pod.
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Used outside a cluster when nothing says otherwise (the manifests' namespace).
pub const DEFAULT_NAMESPACE: &str = "nmo-system";

/// The operator's namespace: `OPERATOR_NAMESPACE`, else `POD_NAMESPACE`, else
/// the service account namespace file, else `nmo-system`.
pub fn operator_namespace() -> String {
    resolve(
        |name| std::env::var(name).ok(),
        || std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE).ok(),
    )
}

/// The lookup order of [`operator_namespace`] over any environment and file
/// reader; empty values count as unset.
pub fn resolve(
    env: impl Fn(&str) -> Option<String>,
    service_account_file: impl FnOnce() -> Option<String>,
) -> String {
    let non_empty = |v: Option<String>| v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    non_empty(env("OPERATOR_NAMESPACE"))
        .or_else(|| non_empty(env("POD_NAMESPACE")))
        .or_else(|| non_empty(service_account_file()))
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)], file: Option<&str>) -> String {
        resolve(
            |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            },
            || file.map(str::to_string),
        )
    }

    #[test]
    fn lookup_order() {
        let both = [("OPERATOR_NAMESPACE", "op"), ("POD_NAMESPACE", "pod")];
        assert_eq!(with(&both, Some("sa")), "op");
        assert_eq!(with(&[("POD_NAMESPACE", "pod")], Some("sa")), "pod");
        assert_eq!(with(&[], Some("sa\n")), "sa");
        assert_eq!(with(&[], None), "nmo-system");
        assert_eq!(
            with(
                &[("OPERATOR_NAMESPACE", ""), ("POD_NAMESPACE", "pod")],
                None
            ),
            "pod",
            "an empty variable counts as unset"
        );
    }
}
