//! glibc's allocator tuned for data passing through: buffered writes hold the HTTP client's
//! received chunks until they are written (no copy), so its read buffers are freed and
//! allocated again at line rate. By default glibc serves those from `mmap` or trims them back
//! to the kernel as soon as they are freed, and every new buffer then pays a page fault and a
//! zeroed page per 4 KiB: on a 2 GiB object that cost more system time than the copy it
//! replaced. Memory is still bounded by the write pool; this only keeps freed memory for
//! reuse, up to [`KEEP_FREED`].

/// Allocations above this come straight from `mmap` (default: 128 KiB, rising on its own).
const MMAP_ABOVE: i32 = 4 << 20;
/// Free memory kept at the top of a heap before it is given back to the kernel.
const KEEP_FREED: i32 = 64 << 20;

/// Applies the tuning, unless `GLIBC_TUNABLES` already tunes malloc.
pub fn tune_for_streaming() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        // SAFETY: mallopt only sets allocator parameters; called before any other thread runs.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_ABOVE);
            libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_FREED);
        }
    }
}
