//! Open-file limits. Each object in flight holds its `.partial` file and its directory open
//! (and briefly a third descriptor while the directory chain is opened), each request a
//! connection, and the run a handful of its own (journal, lock, report, `syncfs` handles,
//! io_uring). Containers often start with a soft limit of 1024 or less, and an init container
//! given `ulimit -n 256` failed 20,000 small objects with EMFILE before these bounds existed.
//! So the soft limit is raised to the hard one, and the objects and requests in flight are
//! bounded by what is left.

/// Descriptors kept aside for everything but objects and connections.
const RESERVED: u64 = 64;
/// Descriptors one object in flight can hold at once.
const PER_OBJECT: u64 = 3;

/// The most requests and objects that may be in flight at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub requests: usize,
    pub objects: usize,
}

/// Raises the soft open-file limit to the hard one and bounds `requests` (and the objects that
/// go with them) by the descriptors it allows.
pub(crate) fn in_flight(requests: usize, objects: usize) -> InFlight {
    let open_files = raise_open_file_limit();
    let bounded = bound(open_files, requests, objects);
    if bounded.objects < objects {
        tracing::info!(
            "open-file limit {open_files}: at most {} requests and {} objects in flight",
            bounded.requests,
            bounded.objects
        );
    }
    bounded
}

fn bound(open_files: u64, requests: usize, objects: usize) -> InFlight {
    let available = open_files.saturating_sub(RESERVED).max(2 + PER_OBJECT);
    let requests = requests.min((available / 2) as usize).max(1);
    let objects = objects
        .min(((available - requests as u64) / PER_OBJECT) as usize)
        .max(1);
    InFlight { requests, objects }
}

/// The soft open-file limit after raising it as far as the hard one allows.
fn raise_open_file_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    // `None` is unlimited.
    let (soft, hard) = (
        limit.current.unwrap_or(u64::MAX),
        limit.maximum.unwrap_or(u64::MAX),
    );
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if soft < hard && setrlimit(Resource::Nofile, raised).is_ok() {
        return hard;
    }
    soft
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generous_limit_changes_nothing() {
        assert_eq!(
            bound(1 << 20, 64, 256),
            InFlight {
                requests: 64,
                objects: 256
            }
        );
    }

    #[test]
    fn a_low_limit_bounds_objects_then_requests() {
        // 256: 192 left, 64 connections, (192 - 64) / 3 objects.
        assert_eq!(
            bound(256, 64, 256),
            InFlight {
                requests: 64,
                objects: 42
            }
        );
        let tiny = bound(70, 64, 256);
        assert!(tiny.requests >= 1 && tiny.objects >= 1);
        assert!(
            tiny.requests as u64 + tiny.objects as u64 * PER_OBJECT <= 70,
            "{tiny:?}"
        );
    }
}
