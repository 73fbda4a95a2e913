//! The API both services speak: the NodeMaintenance type, the NodeDrainRule
//! type, the names and
//! messages of the upstream contract, the build version.

pub mod consts;
pub mod crd;
pub mod drain_rule;
pub mod version;
