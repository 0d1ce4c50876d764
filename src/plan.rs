//! Listing entries → work: which keys may be written where, which are filtered out, how an
//! object is cut into parts.

pub mod filter;
pub mod keys;
pub mod parts;
