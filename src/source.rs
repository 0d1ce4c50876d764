//! The S3 side: `s3://` URLs and mc's aliases, client construction (from its own settings, so this module needs
//! nothing from the sync's configuration), the `ObjectSource` trait the engine reads through and
//! its S3 implementation, the streamed listing, the checks every ranged GET's answer passes, and
//! the one place where S3 and HTTP errors are classified into what hydrator does about them.

#[doc(hidden)]
pub mod bench_support;
pub(crate) mod checksum;
pub mod client;
pub(crate) mod errors;
pub(crate) mod fetch;
pub(crate) mod lean;
pub(crate) mod list;
pub(crate) mod mc_alias;
#[cfg(test)]
pub(crate) mod memory;
pub(crate) mod object_source;
pub(crate) mod s3;
pub(crate) mod tls;
pub(crate) mod unverified_tls;
pub(crate) mod url;
