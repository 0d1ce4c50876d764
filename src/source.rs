//! The S3 side: `s3://` URLs, client construction (from its own settings, so this module needs
//! nothing from the sync's configuration), the streamed listing, ranged GETs, and the one place
//! where S3 and HTTP errors are mapped to what hydrator does about them.

pub mod checksum;
pub mod client;
pub mod errors;
pub mod fetch;
pub mod list;
#[cfg(test)]
pub mod memory;
pub mod object_source;
pub mod s3;
pub mod url;
