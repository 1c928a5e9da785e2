//! CPU time and memory of a process, read from `/proc` (Linux).

use anyhow::{bail, Context, Result};

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
