//! Process-level figures the binary and the load test report.

/// Resident set size of this process in bytes (`VmRSS` in `/proc/self/status`), where the
/// platform has it.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_a_plausible_rss() {
        let rss = super::rss_bytes().expect("linux /proc");
        assert!(rss > 1024 * 1024, "{rss}");
    }
}
