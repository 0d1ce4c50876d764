//! Walks DEST without ever following a symlink: directories are opened with
//! `openat(O_NOFOLLOW | O_DIRECTORY)` relative to their parent and read through their own
//! descriptor, so a symlink swapped in mid-walk is seen as an entry, never entered. The state
//! directory `.hydrator/` is not visited.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use super::dest::{cstring, lstat_at, Dest};
use crate::plan::keys::STATE_DIR;

/// An entry that is not a directory.
pub struct Entry<'a> {
    /// The directory holding it.
    pub dir: &'a OwnedFd,
    pub name: &'a str,
    /// Path relative to DEST.
    pub path: &'a str,
}

/// Calls `visit` for every non-directory entry under DEST (files, symlinks, others). With
/// `remove_empty_dirs`, directories left empty afterwards are removed.
pub fn walk(
    dest: &Dest,
    remove_empty_dirs: bool,
    visit: &mut dyn FnMut(Entry<'_>) -> io::Result<()>,
) -> io::Result<()> {
    walk_dir(&dest.root().try_clone()?, "", remove_empty_dirs, visit)
}

fn walk_dir(
    dir: &OwnedFd,
    prefix: &str,
    remove_empty_dirs: bool,
    visit: &mut dyn FnMut(Entry<'_>) -> io::Result<()>,
) -> io::Result<()> {
    for (name, is_dir) in read_dir(dir)? {
        if prefix.is_empty() && name == STATE_DIR {
            continue;
        }
        let path = format!("{prefix}{name}");
        if is_dir {
            let c_name = cstring(&name)?;
            // SAFETY: valid dirfd and NUL-terminated name.
            let fd = unsafe {
                libc::openat(
                    dir.as_raw_fd(),
                    c_name.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                // Replaced by something else since it was read: visit it as an entry.
                visit(Entry {
                    dir,
                    name: &name,
                    path: &path,
                })?;
                continue;
            }
            // SAFETY: `fd` was just opened and is owned by nobody else.
            let child = unsafe { OwnedFd::from_raw_fd(fd) };
            walk_dir(&child, &format!("{path}/"), remove_empty_dirs, visit)?;
            if remove_empty_dirs {
                // SAFETY: valid dirfd and NUL-terminated name. Fails harmlessly when not empty.
                unsafe { libc::unlinkat(dir.as_raw_fd(), c_name.as_ptr(), libc::AT_REMOVEDIR) };
            }
        } else {
            visit(Entry {
                dir,
                name: &name,
                path: &path,
            })?;
        }
    }
    Ok(())
}

/// The names in `dir` (without `.` and `..`) and whether each is a real directory.
fn read_dir(dir: &OwnedFd) -> io::Result<Vec<(String, bool)>> {
    let fd = dir.try_clone()?.into_raw_fd();
    // SAFETY: `fd` is an owned directory descriptor; fdopendir takes it over.
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let err = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `fd` is still ours to close.
        unsafe { libc::close(fd) };
        return Err(err);
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: `stream` is a valid DIR*.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: readdir returned a valid dirent whose d_name is NUL-terminated.
        let (name, d_type) = unsafe { (CStr::from_ptr((*entry).d_name.as_ptr()), (*entry).d_type) };
        let name = name.to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match d_type {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => is_real_dir(dir, &name),
            _ => false,
        };
        names.push((name, is_dir));
    }
    // SAFETY: `stream` is valid and closed once.
    unsafe { libc::closedir(stream) };
    Ok(names)
}

fn is_real_dir(dir: &OwnedFd, name: &str) -> bool {
    lstat_at(dir, name)
        .is_ok_and(|st| st.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR))
}
