//! Runs a child under a real seccomp filter that refuses `io_uring_setup` with ENOSYS, as the
//! default profiles of Docker, containerd, CRI-O and Podman do.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// `io_uring_setup` in the generic syscall table (x86_64 and aarch64 alike).
const SYS_IO_URING_SETUP: u32 = 425;

pub fn refuse_io_uring(command: &mut Command) {
    let instruction = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let program = [
        // A = syscall number (offset 0 of struct seccomp_data)
        instruction(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        instruction(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            1,
            SYS_IO_URING_SETUP,
        ),
        instruction(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        instruction(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    // SAFETY: the closure runs between fork and exec and only makes two prctl calls on data
    // that lives in this (copied) address space.
    unsafe {
        command.pre_exec(move || {
            let fprog = libc::sock_fprog {
                len: program.len() as u16,
                filter: program.as_ptr() as *mut _,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &fprog as *const _,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
