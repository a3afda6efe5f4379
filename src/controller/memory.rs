//! Keeping a replica's memory near what it uses. glibc's allocator is the one to tame: its
//! defaults suit short programs, not a long-lived process whose allocations come and go in
//! bursts (a minute's runs starting at :00) on a few threads.

use std::time::Duration;

/// How often freed heap pages are handed back to the system.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Asks glibc to serve allocations of 32 KiB and more (list and watch bodies, decoded object
/// lists) from their own mappings, returned to the system when freed. By default glibc raises
/// that threshold after the first such free, up to 32 MiB, and the large buffers then land in
/// the heap, whose freed holes it keeps: with 1,000 idle LockedJobs a replica's RSS was
/// 63–75 MiB with the default and 32–33 MiB with this (measured with the idle mode of the
/// LockedJob-only operator bench that `benches/operator.rs` replaced). Call it before the
/// async runtime starts: called from inside it, the figure was 41–52 MiB.
///
/// It also caps glibc's arenas at the number of cores (the runtime's worker threads). By
/// default glibc gives up to 8 per core to threads that allocate at once, each keeping its own
/// freed memory: under load at 1,000 LockedJobs a replica was ~20 MiB larger than with 2.
pub fn return_large_allocations_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let arenas = libc::c_int::try_from(cores.max(2)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets allocator parameters, under glibc's own locks, so it may
        // be called while other threads allocate; a refusal (it returns 0) changes nothing.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 * 1024);
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

/// Every `TRIM_EVERY`, gives the free pages inside glibc's heaps back to the system
/// (`malloc_trim`, which since glibc 2.8 releases whole free pages anywhere in every arena, not
/// only at the top). The runs of a minute allocate together and free together, and what they
/// freed otherwise stays in the process as RSS until the next burst reuses it. Runs until
/// aborted.
pub async fn trim_periodically() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim takes glibc's arena locks itself; it is safe beside other
        // threads' allocations.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
