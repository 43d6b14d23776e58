//! The string formats the apiserver checks for custom resources (kube-openapi's strfmt
//! registry); formats it does not know are not checked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub(crate) fn is_valid(format: &str, s: &str) -> bool {
    match format {
        "date-time" | "datetime" => is_date_time(s),
        "date" => s.parse::<jiff::civil::Date>().is_ok() && s.len() == 10,
        "uuid" => is_uuid(s, None),
        "uuid3" => is_uuid(s, Some('3')),
        "uuid4" => is_uuid(s, Some('4')),
        "uuid5" => is_uuid(s, Some('5')),
        "ipv4" => s.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => s.contains(':') && s.parse::<Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(s),
        "mac" => is_mac(s),
        "byte" => is_base64(s),
        "hostname" => is_hostname(s),
        "email" => is_email(s),
        _ => true,
    }
}

fn is_date_time(s: &str) -> bool {
    s.parse::<jiff::Timestamp>().is_ok()
        || (s.contains(['T', 't']) && s.parse::<jiff::civil::DateTime>().is_ok())
}

fn is_uuid(s: &str, version: Option<char>) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    if groups.len() != 5
        || groups
            .iter()
            .zip(lens)
            .any(|(g, n)| g.len() != n || !g.chars().all(|c| c.is_ascii_hexdigit()))
    {
        return false;
    }
    match version {
        None => true,
        Some(v) => {
            groups[2].starts_with(v)
                && (v == '3'
                    || groups[3]
                        .chars()
                        .next()
                        .is_some_and(|c| "89abAB".contains(c)))
        }
    }
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, prefix)) = s.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => prefix <= 32,
        Ok(IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

fn is_mac(s: &str) -> bool {
    let hex = |g: &str, n: usize| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit());
    for sep in [':', '-'] {
        let groups: Vec<&str> = s.split(sep).collect();
        if matches!(groups.len(), 6 | 8 | 20) && groups.iter().all(|g| hex(g, 2)) {
            return true;
        }
    }
    let groups: Vec<&str> = s.split('.').collect();
    matches!(groups.len(), 3 | 4 | 10) && groups.iter().all(|g| hex(g, 4))
}

fn is_base64(s: &str) -> bool {
    if !s.len().is_multiple_of(4) {
        return false;
    }
    let body = s.trim_end_matches('=');
    s.len() - body.len() <= 2
        && body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '/')
}

fn is_hostname(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 255
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn is_email(s: &str) -> bool {
    match s.rsplit_once('@') {
        Some((local, domain)) => {
            !local.is_empty() && !domain.is_empty() && !s.contains(char::is_whitespace)
        }
        None => false,
    }
}
