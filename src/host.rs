//! What the machine gives this process: the cores it may run on, the network's speed, and the
//! CPU time it has used.
//!
//! Cores: on Linux, `std::thread::available_parallelism` is already the smaller of the
//! `sched_getaffinity` mask and the cgroup quota (std's `sys/thread/unix.rs` walks `cpu.max`
//! from the process's cgroup in `/proc/self/cgroup` up to `/sys/fs/cgroup`, and reads v1's
//! `cpu.cfs_quota_us`), but it rounds a quota down to whole cores. So hydrator reads the
//! affinity mask and cgroup v2's `cpu.max` itself, the same way, to keep the fraction
//! (`150000 100000` is 1.5 cores, which a CPU-bound run can keep busy); without a v2 quota it
//! takes std's count, which covers v1.
//!
//! Network: the fastest interface that is up, from `/sys/class/net/*/speed` (Mbit/s). Loopback
//! is left out, and virtual interfaces (virtio, veth, bridges) answer -1 or EINVAL, so in many
//! VMs and pods the speed is unknown.

use std::path::Path;

/// A cgroup v2 CPU quota: `limit` µs of CPU every `period` µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Quota {
    pub limit: u64,
    pub period: u64,
}

impl Quota {
    pub(crate) fn cores(self) -> f64 {
        self.limit as f64 / self.period as f64
    }
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (limit, period, cores) = (self.limit, self.period, self.cores());
        write!(f, "cpu.max {limit}/{period} = {cores:.2} cores")
    }
}

/// The fastest network interface that is up.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Nic {
    pub name: String,
    pub mbit_per_second: u64,
}

/// The CPU and network this process may use.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Host {
    /// `available_parallelism`: affinity and quota, rounded down.
    pub parallelism: usize,
    /// CPUs in the affinity mask.
    pub affinity: Option<usize>,
    pub quota: Option<Quota>,
    pub nic: Option<Nic>,
}

impl Host {
    /// Reads this machine.
    pub(crate) fn read() -> Self {
        let root = Path::new("/");
        Self {
            parallelism: std::thread::available_parallelism().map_or(1, |n| n.get()),
            affinity: affinity(),
            quota: cpu_quota(root),
            nic: fastest_nic(&root.join("sys/class/net")),
        }
    }

    /// The cores the process may keep busy, a fraction under a quota.
    pub(crate) fn cores(&self) -> f64 {
        match (self.quota, self.affinity) {
            (Some(quota), Some(affinity)) => quota.cores().min(affinity as f64),
            _ => self.parallelism as f64,
        }
    }
}

/// CPUs in this process's affinity mask.
fn affinity() -> Option<usize> {
    // SAFETY: an all-zero `cpu_set_t` is an empty set; the kernel fills in at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid, writable `cpu_set_t` of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return None;
    }
    // SAFETY: `set` was initialised above.
    let count = unsafe { libc::CPU_COUNT(&set) };
    usize::try_from(count).ok().filter(|&n| n > 0)
}

/// The tightest cgroup v2 `cpu.max` from this process's cgroup up to the hierarchy's root, as
/// seen under `root` (`/`, or a fake tree in tests); `None` when no level sets one.
pub(crate) fn cpu_quota(root: &Path) -> Option<Quota> {
    let cgroups = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
    // The v2 line is `0::/path`.
    let path = cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
    let mount = root.join("sys/fs/cgroup");
    let mut dir = mount.join(path.trim_start_matches('/'));
    let mut tightest: Option<Quota> = None;
    while dir.starts_with(&mount) {
        let quota = std::fs::read_to_string(dir.join("cpu.max"))
            .ok()
            .and_then(|text| parse_cpu_max(&text));
        if let Some(quota) = quota {
            if tightest.is_none_or(|t| quota.cores() < t.cores()) {
                tightest = Some(quota);
            }
        }
        if !dir.pop() {
            break;
        }
    }
    tightest
}

/// `cpu.max`: `LIMIT PERIOD`, or `max PERIOD` for no quota.
fn parse_cpu_max(text: &str) -> Option<Quota> {
    let mut fields = text.split_whitespace();
    let (limit, period) = (fields.next()?.parse().ok()?, fields.next()?.parse().ok()?);
    (period > 0).then_some(Quota { limit, period })
}

/// The fastest interface under `net` (`/sys/class/net`) that is up and knows its speed.
pub(crate) fn fastest_nic(net: &Path) -> Option<Nic> {
    let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
    std::fs::read_dir(net)
        .ok()?
        .flatten()
        .filter(|entry| entry.file_name() != "lo")
        .filter_map(|entry| {
            let dir = entry.path();
            if read(&dir, "operstate")?.trim() != "up" {
                return None;
            }
            // -1 or EINVAL: the interface does not know.
            let speed: i64 = read(&dir, "speed")?.trim().parse().ok()?;
            Some(Nic {
                name: entry.file_name().to_string_lossy().into_owned(),
                mbit_per_second: u64::try_from(speed).ok().filter(|&s| s > 0)?,
            })
        })
        .max_by_key(|nic| nic.mbit_per_second)
}

/// CPU time (user and system) this process has used so far, in seconds.
pub(crate) fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero `rusage` is valid; `getrusage` fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn the_tightest_cpu_max_on_the_way_up_is_the_quota() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        assert_eq!(cpu_quota(root), None, "no /proc/self/cgroup");
        write(root, "proc/self/cgroup", "0::/kubepods/pod1/c1\n");
        write(
            root,
            "sys/fs/cgroup/kubepods/pod1/c1/cpu.max",
            "max 100000\n",
        );
        assert_eq!(cpu_quota(root), None, "max is no quota");
        write(
            root,
            "sys/fs/cgroup/kubepods/pod1/cpu.max",
            "150000 100000\n",
        );
        write(root, "sys/fs/cgroup/kubepods/cpu.max", "400000 100000\n");
        let quota = cpu_quota(root).unwrap();
        assert_eq!(quota.cores(), 1.5);
        assert_eq!(quota.to_string(), "cpu.max 150000/100000 = 1.50 cores");
        write(
            root,
            "sys/fs/cgroup/kubepods/pod1/c1/cpu.max",
            "50000 100000\n",
        );
        assert_eq!(cpu_quota(root).unwrap().cores(), 0.5, "the container's own");
    }

    #[test]
    fn a_v1_only_process_or_a_broken_cpu_max_has_no_quota() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        write(root, "proc/self/cgroup", "4:cpu,cpuacct:/docker/x\n");
        write(root, "sys/fs/cgroup/cpu.max", "150000 100000\n");
        assert_eq!(cpu_quota(root), None, "no v2 line");
        write(root, "proc/self/cgroup", "0::/\n");
        assert_eq!(cpu_quota(root).unwrap().cores(), 1.5, "the root's own");
        write(root, "sys/fs/cgroup/cpu.max", "150000 0\n");
        assert_eq!(cpu_quota(root), None);
    }

    #[test]
    fn cores_are_the_quota_within_the_affinity_mask() {
        let host = |affinity, quota| Host {
            parallelism: 3,
            affinity,
            quota,
            nic: None,
        };
        let quota = |limit| {
            Some(Quota {
                limit,
                period: 100_000,
            })
        };
        assert_eq!(host(Some(4), quota(150_000)).cores(), 1.5);
        assert_eq!(
            host(Some(2), quota(800_000)).cores(),
            2.0,
            "the mask is tighter"
        );
        assert_eq!(
            host(Some(4), None).cores(),
            3.0,
            "std's count without a v2 quota"
        );
        assert_eq!(host(None, quota(150_000)).cores(), 3.0);
    }

    #[test]
    fn the_fastest_nic_that_is_up_and_knows_its_speed() {
        let net = tempfile::tempdir().unwrap();
        let net = net.path();
        assert_eq!(fastest_nic(net), None, "no interfaces");
        write(net, "lo/operstate", "unknown\n");
        write(net, "eth0/operstate", "up\n");
        write(net, "eth0/speed", "-1\n");
        write(net, "ifb0/operstate", "down\n");
        assert_eq!(fastest_nic(net), None, "loopback, -1 and no speed file");
        write(net, "eth1/operstate", "up\n");
        write(net, "eth1/speed", "10000\n");
        write(net, "eth2/operstate", "down\n");
        write(net, "eth2/speed", "100000\n");
        write(net, "eth3/operstate", "up\n");
        write(net, "eth3/speed", "25000\n");
        write(net, "lo/speed", "400000\n");
        assert_eq!(
            fastest_nic(net),
            Some(Nic {
                name: "eth3".into(),
                mbit_per_second: 25_000
            }),
            "eth2 is down, lo is left out"
        );
    }

    #[test]
    fn cpu_time_counts_a_busy_loop() {
        let before = cpu_seconds();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let used = cpu_seconds() - before;
        assert!(used > 0.02, "{used} s of CPU for 100 ms of spinning");
    }
}
