//! Process-level figures the binary and the load test report.

/// Resident set size of this process in bytes (`VmRSS` in `/proc/self/status`), where the
/// platform has it.
pub fn rss_bytes() -> Option<u64> {
    rss_in(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// Resident set size of process `pid` in bytes, None once it is gone.
pub fn rss_bytes_of(pid: u32) -> Option<u64> {
    rss_in(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// Anonymous resident memory of process `pid` in bytes (`RssAnon`: its heap and stacks,
/// not the pages of its binary it has mapped), None once it is gone.
pub fn rss_anon_bytes_of(pid: u32) -> Option<u64> {
    field_in(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        "RssAnon:",
    )
}

/// `VmRSS` of a `/proc/<pid>/status` text, in bytes.
pub fn rss_in(status: &str) -> Option<u64> {
    field_in(status, "VmRSS:")
}

/// A `/proc/<pid>/status` field given in kB, in bytes.
fn field_in(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
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

    #[test]
    fn reads_vmrss_from_a_status_text() {
        let status = "Name:\tactivator\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\n";
        assert_eq!(super::rss_in(status), Some(12345 * 1024));
        assert_eq!(super::rss_in("Name:\tactivator\n"), None);
        let status = "VmRSS:\t  16296 kB\nRssAnon:\t    2304 kB\nRssFile:\t   13992 kB\n";
        assert_eq!(super::field_in(status, "RssAnon:"), Some(2304 * 1024));
    }
}
