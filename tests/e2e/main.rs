//! End-to-end: the real `hydrator` binary against real S3 servers (the in-process s3s server
//! behind a fault injector, Garage, moto and MinIO), on real files.

#[macro_use]
mod support;
mod access;
mod container;
mod csi;
mod csi_sanity;
mod daemon;
mod dataset;
mod docs;
mod dry_run;
mod fleet;
mod front_door;
mod habits;
mod https;
mod leased;
mod memory;
mod minio;
mod mount;
mod output;
mod p2p;
mod progress;
mod soak;
mod space;
mod sync;
mod torture;
