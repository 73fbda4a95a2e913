//! Facts about nodes that both services derive from labels.

use std::collections::BTreeMap;

use crate::consts::{ROLE_CONTROL_PLANE_LABEL, ROLE_MASTER_LABEL};

/// A node is control plane when it carries either role label (any value).
pub fn is_control_plane(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|l| {
        l.contains_key(ROLE_MASTER_LABEL) || l.contains_key(ROLE_CONTROL_PLANE_LABEL)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        let mut l = BTreeMap::new();
        assert!(!is_control_plane(None));
        assert!(!is_control_plane(Some(&l)));
        l.insert(ROLE_MASTER_LABEL.to_string(), String::new());
        assert!(is_control_plane(Some(&l)));
        l.clear();
        l.insert(ROLE_CONTROL_PLANE_LABEL.to_string(), "true".into());
        assert!(is_control_plane(Some(&l)));
        l.clear();
        l.insert("node-role.kubernetes.io/worker".into(), String::new());
        assert!(!is_control_plane(Some(&l)));
    }
}
