//! Gives memory freed on the calling thread back to the system.
//!
//! The server allocates with mimalloc. Memory a thread frees goes back to that thread's heap and
//! stays in the process until the thread allocates again in the same size classes, so after a
//! burst of connections closes, resident memory stays at its peak. [`release_freed`] asks
//! mimalloc to collect the calling thread's heap: free pages are returned and, with them, the
//! segments other threads abandoned. The server calls it from each worker thread as it goes
//! idle, at most once a second ([`on_idle`]).

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Collects the calling thread's heap (see the crate's docs).
#[allow(unsafe_code)]
pub fn release_freed() {
    // SAFETY: `mi_collect` takes no pointer and only walks the allocator's own free lists and
    // segments; it may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(false) };
}

/// For a runtime's `on_thread_park` hook: [`release_freed`], at most once every `every` on
/// each thread (a worker parks many times a second; a collection walks its heap).
pub fn on_idle(every: Duration) {
    thread_local! {
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    let now = Instant::now();
    let due = LAST.with(|last| {
        let due = last.get().is_none_or(|at| now.duration_since(at) >= every);
        if due {
            last.set(Some(now));
        }
        due
    });
    if due {
        release_freed();
    }
}

/// Bytes the C allocator (glibc's malloc) has handed out and not had back, in every arena:
/// for tests that show memory held by code on the system allocator coming back. `None` where
/// the C library is not glibc.
pub fn c_heap_in_use() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallinfo2` takes no pointer and returns a plain struct by value; glibc
        // computes it under the arenas' locks.
        #[allow(unsafe_code)]
        let info = unsafe { libc::mallinfo2() };
        Some(info.uordblks + info.hblkhd)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collecting_on_any_thread_is_harmless() {
        let kept: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 512]).collect();
        release_freed();
        std::thread::spawn(|| on_idle(Duration::ZERO))
            .join()
            .unwrap();
        on_idle(Duration::from_secs(1));
        on_idle(Duration::from_secs(1));
        assert!(kept.iter().enumerate().all(|(i, v)| v[511] == i as u8));
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_c_heap_counts_what_is_held() {
        let before = c_heap_in_use().expect("glibc");
        let held: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 1 << 20]).collect();
        let during = c_heap_in_use().expect("glibc");
        assert!(during >= before + (60 << 20), "{before} -> {during}");
        drop(held);
        assert!(c_heap_in_use().expect("glibc") < during - (60 << 20));
    }
}
