//! Prints a CRD as YAML (`make crds` writes both to manifests/crd/):
//! `crdgen` or `crdgen nodemaintenances` the NodeMaintenance CRD,
//! `crdgen nodedrainrules` the NodeDrainRule CRD.
fn main() {
    let which = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "nodemaintenances".into());
    let yaml = match which.as_str() {
        "nodemaintenances" => shared::api::crd::crd_yaml(),
        "nodedrainrules" => shared::api::drain_rule::crd_yaml(),
        other => {
            eprintln!("crdgen: unknown CRD {other:?}: name nodemaintenances or nodedrainrules");
            std::process::exit(2);
        }
    };
    match yaml {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("crdgen: could not render the {which} CRD as YAML: {e}");
            std::process::exit(1);
        }
    }
}
