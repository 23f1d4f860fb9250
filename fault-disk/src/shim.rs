//! The SQLite VFS: every call goes to the operating system's default VFS, and writes,
//! truncations, syncs and deletions are first shown to the [`Disk`].
//!
//! This is the crate's only unsafe code: SQLite calls a VFS through C function pointers. Each
//! file SQLite opens is a [`ShimFile`] (SQLite allocates `szOsFile` bytes for it), with the
//! default VFS's own file right after it in the same allocation; every method finds that file
//! and calls the default VFS's method on it.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::size_of;
use std::path::Path;
use std::ptr::null;
use std::sync::{Arc, Mutex};

use rusqlite::ffi;

use crate::{Disk, Op, Refusal, Tracked};

/// A file as SQLite's VFS methods take it.
type File = ffi::sqlite3_file;

/// What a registered VFS points to (leaked: SQLite keeps a VFS for the process's life).
struct Registered {
    parent: *mut ffi::sqlite3_vfs,
    disk: Disk,
}

/// A file SQLite opened through the VFS; the default VFS's file follows it.
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    reg: *const Registered,
    /// `Arc::into_raw` of the tracked file, or null (a file with no name).
    track: *const Mutex<Tracked>,
}

/// Where the default VFS's file is: right after ours (its size is a multiple of 8).
const REAL_AT: usize = size_of::<ShimFile>().next_multiple_of(16);

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

/// A method that only calls the default VFS's (or answers `$missing` if it has none).
macro_rules! forward {
    ($name:ident, $method:ident, $missing:expr, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(f: *mut File $(, $arg: $ty)*) -> c_int {
            let (_, _, real) = parts(f);
            match methods(real).$method {
                Some(m) => m(real $(, $arg)*),
                None => $missing,
            }
        }
    };
}

/// Registers `disk`'s VFS under `name`.
pub(crate) fn register(name: &str, disk: Disk) -> std::io::Result<()> {
    let cname = CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: sqlite3_initialize may be called any number of times; sqlite3_vfs_find(NULL)
    // answers the default VFS, which SQLite keeps for the process's life.
    let parent = unsafe {
        ffi::sqlite3_initialize();
        ffi::sqlite3_vfs_find(null())
    };
    if parent.is_null() {
        return Err(std::io::Error::other("SQLite has no default VFS"));
    }
    let reg = Box::into_raw(Box::new(Registered { parent, disk }));
    // SAFETY: `parent` is valid (above); the copy keeps its methods that take no file (they
    // do not depend on which VFS struct they are called with, for the unix VFS) and replaces
    // those that open and delete files. The name and the struct are leaked: SQLite keeps
    // pointers to both for the process's life.
    let rc = unsafe {
        let mut vfs: ffi::sqlite3_vfs = *parent;
        vfs.iVersion = vfs.iVersion.min(2);
        vfs.szOsFile = (REAL_AT + (*parent).szOsFile as usize) as c_int;
        vfs.pNext = std::ptr::null_mut();
        vfs.zName = cname.into_raw();
        vfs.pAppData = reg.cast();
        vfs.xOpen = Some(open);
        vfs.xDelete = Some(delete);
        ffi::sqlite3_vfs_register(Box::into_raw(Box::new(vfs)), 0)
    };
    if rc != ffi::SQLITE_OK {
        return Err(std::io::Error::other(format!(
            "sqlite3_vfs_register answered {rc}"
        )));
    }
    Ok(())
}

fn code(r: Refusal, io: c_int) -> c_int {
    match r {
        Refusal::Off => io,
        Refusal::SyncFailed => ffi::SQLITE_IOERR_FSYNC,
        Refusal::Full => ffi::SQLITE_FULL,
    }
}

/// # Safety
/// `vfs` is one [`register`] made.
unsafe fn registered<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a Registered {
    &*((*vfs).pAppData as *const Registered)
}

/// # Safety
/// `f` is a [`ShimFile`] that [`open`] filled.
unsafe fn parts<'a>(f: *mut File) -> (&'a Registered, Option<&'a Mutex<Tracked>>, *mut File) {
    let shim = &*(f as *const ShimFile);
    let real = (f as *mut u8).add(REAL_AT) as *mut File;
    (&*shim.reg, shim.track.as_ref(), real)
}

/// # Safety
/// `real` is an open file of the default VFS.
unsafe fn methods<'a>(real: *mut File) -> &'a ffi::sqlite3_io_methods {
    &*(*real).pMethods
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut File,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let reg = registered(vfs);
    let shim = file as *mut ShimFile;
    let real = (file as *mut u8).add(REAL_AT) as *mut File;
    (*shim).base.pMethods = null();
    let rc = match (*reg.parent).xOpen {
        Some(f) => f(reg.parent, name, real, flags, out_flags),
        None => ffi::SQLITE_CANTOPEN,
    };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let track = if name.is_null() {
        null()
    } else {
        let path = CStr::from_ptr(name).to_string_lossy().into_owned();
        Arc::into_raw(reg.disk.track(Path::new(&path)))
    };
    (*shim).reg = reg;
    (*shim).track = track;
    (*shim).base.pMethods = &METHODS;
    ffi::SQLITE_OK
}

unsafe extern "C" fn delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    let reg = registered(vfs);
    if let Err(r) = reg.disk.before_change() {
        return code(r, ffi::SQLITE_IOERR_DELETE);
    }
    let rc = match (*reg.parent).xDelete {
        Some(f) => f(reg.parent, name, sync_dir),
        None => ffi::SQLITE_IOERR_DELETE,
    };
    if rc == ffi::SQLITE_OK && !name.is_null() {
        let path = CStr::from_ptr(name).to_string_lossy().into_owned();
        reg.disk.forget(Path::new(&path));
    }
    rc
}

unsafe extern "C" fn close(f: *mut File) -> c_int {
    let (_, _, real) = parts(f);
    let rc = match methods(real).xClose {
        Some(m) => m(real),
        None => ffi::SQLITE_OK,
    };
    let shim = f as *mut ShimFile;
    if !(*shim).track.is_null() {
        drop(Arc::from_raw((*shim).track));
        (*shim).track = null();
    }
    rc
}

forward!(read_through, xRead, ffi::SQLITE_IOERR_READ, (buf: *mut c_void, n: c_int, off: i64));
forward!(write_through, xWrite, ffi::SQLITE_IOERR_WRITE, (buf: *const c_void, n: c_int, off: i64));

unsafe extern "C" fn read(f: *mut File, buf: *mut c_void, n: c_int, off: i64) -> c_int {
    if parts(f).0.disk.is_off() {
        return ffi::SQLITE_IOERR_READ;
    }
    read_through(f, buf, n, off)
}

unsafe extern "C" fn write(f: *mut File, buf: *const c_void, n: c_int, off: i64) -> c_int {
    let (reg, track, _) = parts(f);
    if let Err(r) = reg.disk.before_write(n as usize) {
        return code(r, ffi::SQLITE_IOERR_WRITE);
    }
    let rc = write_through(f, buf, n, off);
    if rc == ffi::SQLITE_OK {
        if let Some(t) = track {
            let data = std::slice::from_raw_parts(buf as *const u8, n as usize).to_vec();
            let offset = off as u64;
            reg.disk.note(t, Op::Write { offset, data });
        }
    }
    rc
}

unsafe extern "C" fn truncate(f: *mut File, size: i64) -> c_int {
    let (reg, track, real) = parts(f);
    if let Err(r) = reg.disk.before_change() {
        return code(r, ffi::SQLITE_IOERR_TRUNCATE);
    }
    let rc = match methods(real).xTruncate {
        Some(m) => m(real, size),
        None => ffi::SQLITE_IOERR_TRUNCATE,
    };
    if rc == ffi::SQLITE_OK {
        if let Some(t) = track {
            reg.disk.note(t, Op::Truncate(size as u64));
        }
    }
    rc
}

unsafe extern "C" fn sync(f: *mut File, _flags: c_int) -> c_int {
    // The real file is not synced: durability is the disk's to simulate, and a run of
    // thousands of seeds would otherwise wait on the machine's disk.
    let (reg, track, _) = parts(f);
    match track {
        Some(t) => match reg.disk.sync(t) {
            Ok(()) => ffi::SQLITE_OK,
            Err(r) => code(r, ffi::SQLITE_IOERR_FSYNC),
        },
        None => ffi::SQLITE_OK,
    }
}

forward!(file_size, xFileSize, ffi::SQLITE_IOERR_FSTAT, (size: *mut i64));
forward!(lock, xLock, ffi::SQLITE_IOERR_LOCK, (level: c_int));
forward!(unlock, xUnlock, ffi::SQLITE_IOERR_UNLOCK, (level: c_int));
forward!(check_reserved_lock, xCheckReservedLock, ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, (out: *mut c_int));
forward!(file_control, xFileControl, ffi::SQLITE_NOTFOUND, (op: c_int, arg: *mut c_void));
forward!(sector_size, xSectorSize, 4096, ());
forward!(device_characteristics, xDeviceCharacteristics, 0, ());
forward!(shm_map, xShmMap, ffi::SQLITE_IOERR_SHMMAP, (region: c_int, size: c_int, extend: c_int, out: *mut *mut c_void));
forward!(shm_lock, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, (offset: c_int, n: c_int, flags: c_int));
forward!(shm_unmap, xShmUnmap, ffi::SQLITE_OK, (delete: c_int));

unsafe extern "C" fn shm_barrier(f: *mut File) {
    let (_, _, real) = parts(f);
    if let Some(m) = methods(real).xShmBarrier {
        m(real)
    }
}
