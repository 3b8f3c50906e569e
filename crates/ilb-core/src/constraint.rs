//! Which engines a traffic class may use. The one rule: an engine serves a class when it has
//! every capability the class requires and, if the class names a residency zone, it is in
//! that zone. The control plane plans with it, the routing table checks requests with it and
//! the fleet simulator validates scenarios with it.

/// Whether an engine with `capabilities` in the zones `engine_residency` may serve a class
/// requiring `require` (all of them) and `residency` (if any).
pub fn satisfies<S: AsRef<str>>(
    require: &[S],
    residency: Option<&str>,
    capabilities: &[String],
    engine_residency: &[String],
) -> bool {
    require.iter().all(|cap| capabilities.iter().any(|c| c == cap.as_ref()))
        && residency.is_none_or(|zone| engine_residency.iter().any(|z| z == zone))
}

#[cfg(test)]
mod tests {
    use super::satisfies;

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn needs_every_capability_and_the_zone() {
        let caps = strings(&["tools", "vision"]);
        let zones = strings(&["eu"]);
        assert!(satisfies::<&str>(&[], None, &[], &[]));
        assert!(satisfies(&["tools"], None, &caps, &[]));
        assert!(satisfies(&["tools", "vision"], Some("eu"), &caps, &zones));
        assert!(!satisfies(&["tools", "json"], None, &caps, &zones));
        assert!(!satisfies::<&str>(&[], Some("us"), &caps, &zones));
        assert!(!satisfies::<&str>(&[], Some("eu"), &caps, &[]));
    }
}
