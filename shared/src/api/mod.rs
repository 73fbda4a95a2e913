//! The API both services speak: the NodeMaintenance type, the names and
//! messages of the upstream contract, the build version.

pub mod consts;
pub mod crd;
pub mod version;
