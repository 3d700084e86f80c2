//! What the bench reads about its own process and the machine from `/proc`.

use std::time::Duration;

/// User + system CPU time of this process.
pub(crate) fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after ')'.
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    // The kernel's USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Resident memory of this process, MiB.
pub(crate) fn rss_mib() -> f64 {
    rss_mib_of("self")
}

/// Resident memory of process `pid` (`self` for this one), MiB; 0 when unknown.
pub(crate) fn rss_mib_of(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |pages| pages * 4096.0 / (1024.0 * 1024.0))
}

/// The 1-minute load average.
pub(crate) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The CPUs this process may run on, as the kernel lists them (`0`, `0-1`…).
pub(crate) fn allowed_cpus() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
                .map(|cpus| cpus.trim().to_owned())
        })
        .unwrap_or_default()
}

/// CPU time spent by a set of processes, every thread counted, read from
/// `/proc/PID/task/TID/schedstat` (nanoseconds, unlike the 10 ms ticks of `stat`).
#[derive(Debug, Clone)]
pub(crate) struct CpuMeter {
    pids: Vec<String>,
}

impl CpuMeter {
    /// This process.
    pub(crate) fn this_process() -> CpuMeter {
        CpuMeter {
            pids: vec!["self".to_owned()],
        }
    }

    /// The processes `pids` and, read now, every process descending from them (PostgreSQL's
    /// backends are children of the one server process).
    pub(crate) fn processes(pids: &[u32]) -> CpuMeter {
        let mut all: Vec<u32> = pids.to_vec();
        let parents = parent_pids();
        let mut i = 0;
        while i < all.len() {
            let parent = all[i];
            for &(child, ppid) in &parents {
                if ppid == parent && !all.contains(&child) {
                    all.push(child);
                }
            }
            i += 1;
        }
        CpuMeter {
            pids: all.iter().map(u32::to_string).collect(),
        }
    }

    /// CPU time so far, summed over the threads alive now, ns.
    pub(crate) fn read_ns(&self) -> u64 {
        self.pids
            .iter()
            .filter_map(|pid| std::fs::read_dir(format!("/proc/{pid}/task")).ok())
            .flat_map(|tasks| tasks.flatten())
            .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

/// Every process's (pid, parent pid).
fn parent_pids() -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`: comm may hold spaces, so read after the last ')'.
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect()
}
