//! Listing entries → work: which keys may be written where, which are filtered out, how an
//! object is cut into parts.

pub(crate) mod filter;
pub(crate) mod keys;
pub(crate) mod parts;
pub(crate) mod shard;
