//! The default thread count: one per physical core this process may run on,
//! as llama.cpp defaults to its physical cores. Hyperthread siblings share a
//! core's vector units and caches, so a second thread per core slows the
//! kernels rather than helping them.

use std::collections::HashSet;

/// Threads to use when `-t` is not given: the physical cores among the CPUs
/// this process may run on (its affinity mask), never more than the logical
/// CPUs the standard library reports (which also honours cgroup quotas).
/// Where the topology cannot be read, the logical count.
pub fn default_threads() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    physical_cores().map_or(logical, |p| p.clamp(1, logical))
}

/// Distinct (package, core) pairs among the CPUs in this process's
/// affinity list, from Linux's /proc and /sys; `None` elsewhere or when a
/// file is missing.
pub fn physical_cores() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    let mut cores = HashSet::new();
    for cpu in parse_cpu_list(list.trim())? {
        let topology = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        let read = |name: &str| -> Option<i64> {
            std::fs::read_to_string(format!("{topology}/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        cores.insert((read("physical_package_id")?, read("core_id")?));
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Parses Linux's CPU list format ("0-3,8,10-11") into CPU numbers.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_linux_writes_them() {
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn the_default_is_between_one_and_the_logical_cpus() {
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        let t = default_threads();
        assert!((1..=logical).contains(&t), "{t} of {logical}");
        if let Some(p) = physical_cores() {
            assert_eq!(t, p.min(logical));
        }
    }
}
