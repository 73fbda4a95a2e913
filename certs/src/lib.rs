//! Certificates for the NMO webhook: a CA, serving certificates with DNS and IP
//! SANs, the caBundle a webhook configuration wants, and writing them to disk in
//! the kubelet secret-volume layout (`..data` symlink swap) so local runs and
//! tests rotate certificates exactly as Kubernetes does.

mod ca;
mod error;
mod layout;

pub use ca::{Ca, ServingCert, ca_bundle_base64, not_after};
pub use error::CertError;
pub use layout::{
    CA_CRT, CA_KEY, OLM_CRT, OLM_KEY, TLS_CRT, TLS_KEY, serving_files, write_kubelet_layout,
    write_kubelet_layout_owned, write_olm_set, write_plain_files, write_serving_set,
    write_serving_set_owned,
};
