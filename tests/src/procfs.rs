//! CPU time and memory of a process, read from `/proc` (Linux), and the
//! calling thread's own CPU clocks (for in-process benchmarks).

use anyhow::{bail, Context, Result};
use std::time::Duration;

/// This thread's CPU time, user and kernel (including work the kernel does
/// in its context, such as delivering loopback packets), in nanoseconds.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// This thread's user-mode CPU (its own code, without the kernel's share).
/// The kernel samples the user/system split at clock ticks, so it is only
/// meaningful over many iterations.
pub fn thread_user_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    Duration::new(ru.ru_utime.tv_sec as u64, ru.ru_utime.tv_usec as u32 * 1000)
}

/// User plus system CPU time of `pid` (all its threads) in microseconds.
/// The kernel counts in clock ticks (usually 10 ms), so measure over runs
/// long enough that a tick is noise.
pub fn cpu_micros(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces: split after its ')'.
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .context("malformed /proc stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ')' the fields start at 3 (state); utime is 14, stime 15.
    let (Some(utime), Some(stime)) = (fields.get(14 - 3), fields.get(15 - 3)) else {
        bail!("malformed /proc/{pid}/stat");
    };
    let ticks: u64 = utime.parse::<u64>()? + stime.parse::<u64>()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Ok(ticks * 1_000_000 / hz)
}

/// A `kB` line of `/proc/<pid>/status` (`VmHWM`, `VmRSS`, ...), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix(field) {
            if let Some(value) = rest.strip_prefix(':') {
                let kib = value.trim().trim_end_matches("kB").trim();
                return kib.parse().with_context(|| format!("{field} in {line}"));
            }
        }
    }
    bail!("{field} not in /proc/{pid}/status")
}

/// Peak resident memory (`VmHWM`) in KiB.
pub fn peak_rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmHWM")
}

/// Current resident memory (`VmRSS`) in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS")
}

/// User plus system CPU time, in microseconds, of every live process in
/// process group `pgid` (a router that forks helpers counts as a whole).
pub fn group_cpu_micros(pgid: u32) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // SAFETY: getpgid only reads the process table.
        let group = unsafe { libc::getpgid(pid as i32) };
        if group == pgid as i32 {
            total += cpu_micros(pid).unwrap_or(0);
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_and_memory() {
        let pid = std::process::id();
        let before = cpu_micros(pid).unwrap();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(60) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        let after = cpu_micros(pid).unwrap();
        assert!(after > before, "60 ms of spinning must show as CPU time");
        assert!(rss_kib(pid).unwrap() > 0);
        assert!(peak_rss_kib(pid).unwrap() >= rss_kib(pid).unwrap());
    }
}
