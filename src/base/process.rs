//! Process-wide resources the proxy sets at start and keeps in shape while it runs: the
//! open-files limit, and memory the allocator holds after a burst.

/// The soft open-files limit raised to the hard one (macOS: at most `OPEN_MAX`, 10240, which is
/// what its `setrlimit` accepts). A proxy holds two sockets per connection plus files: the
/// usual soft default (256 on macOS, 1024 on Linux) fails with "too many open files" long
/// before the hard limit. Returns the limit before and after; `None` where there is no such
/// limit or it could not be read or raised.
pub fn raise_open_files_limit() -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        const MAC_OPEN_MAX: u64 = 10_240;
        let limit = getrlimit(Resource::Nofile);
        let before = limit.current?;
        let mut target = limit.maximum.unwrap_or(u64::MAX);
        if cfg!(target_os = "macos") {
            target = target.min(MAC_OPEN_MAX);
        }
        if target == u64::MAX || before >= target {
            return Some((before, before));
        }
        let raised = Rlimit {
            current: Some(target),
            maximum: limit.maximum,
        };
        setrlimit(Resource::Nofile, raised).ok()?;
        Some((before, target))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Hands the memory the allocator keeps free back to the OS. glibc's malloc keeps what a burst
/// freed in its per-thread arenas (only the top of each shrinks by itself), so a proxy that
/// once held many large bodies would keep that memory for good; `malloc_trim` releases the
/// free pages of every arena. Returns whether this allocator has such a means.
pub fn give_back_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` takes no pointer from us; it walks glibc's own arenas, each
        // under its lock, and only releases pages that hold no live allocation.
        unsafe {
            libc::malloc_trim(0);
        }
        true
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// This process's resident memory in bytes (Linux: `/proc/self/statm`), `None` elsewhere.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn the_soft_open_files_limit_goes_up_to_the_hard_one() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let limit = getrlimit(Resource::Nofile);
        let Some(hard) = limit.maximum.filter(|h| *h > 256) else {
            println!("SKIPPED the_soft_open_files_limit_goes_up_to_the_hard_one: hard limit too low or unlimited");
            return;
        };
        let lowered = Rlimit {
            current: Some(256),
            maximum: Some(hard),
        };
        setrlimit(Resource::Nofile, lowered).expect("lowering the soft limit");
        let (before, after) = raise_open_files_limit().expect("raised");
        assert_eq!(before, 256);
        let expected = if cfg!(target_os = "macos") {
            hard.min(10_240)
        } else {
            hard
        };
        assert_eq!(after, expected);
        assert_eq!(getrlimit(Resource::Nofile).current, Some(expected));
    }
}
