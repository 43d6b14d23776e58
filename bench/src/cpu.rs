//! CPU time a process and its children have used, from `/proc` (Linux). CPU per request is
//! the steadier figure on a shared machine: throughput moves with whatever else runs, the
//! work each request costs does not.

use std::time::Duration;

/// User + system CPU of `pid` and its direct children (nginx's master and its workers), or
/// None where `/proc` cannot tell.
pub fn of_tree(pid: u32) -> Option<Duration> {
    let tick = ticks_per_second();
    let mut ticks = own_ticks(pid)?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if child != pid
            && let Some((ppid, t)) = stat(child)
            && ppid == pid
        {
            ticks += t;
        }
    }
    Some(Duration::from_secs_f64(ticks as f64 / tick))
}

fn own_ticks(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, t)| t)
}

/// (parent pid, utime + stime in clock ticks) from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&s)
}

/// The command name (field 2) is in parentheses and may hold spaces: fields are counted
/// from its closing parenthesis.
fn parse_stat(s: &str) -> Option<(u32, u64)> {
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15).
    let ppid = f.get(1)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// `getconf CLK_TCK`; 100, Linux's USER_HZ, if it cannot be asked.
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let line = "4242 (nginx: worker) S 4241 4241 4241 0 -1 4194624 1 0 0 0 250 75 0 0 20 0 1 0";
        assert_eq!(parse_stat(line), Some((4241, 325)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        // Burn a little so that at least one tick is counted.
        let began = std::time::Instant::now();
        let mut x = 0u64;
        while began.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        assert!(x != 1);
        assert!(of_tree(std::process::id()).is_some_and(|d| d > Duration::ZERO));
    }
}
