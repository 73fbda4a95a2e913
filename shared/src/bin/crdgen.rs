//! Prints the NodeMaintenance CRD as YAML (`make crds` writes it to manifests/).
fn main() {
    match shared::api::crd::crd_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("crdgen: could not render the NodeMaintenance CRD as YAML: {e}");
            std::process::exit(1);
        }
    }
}
