//! Reading a Prometheus text page the way a dashboard would.

/// The value of the first sample of `name` whose labels include all of
/// `labels` (`key="value"` strings) on a Prometheus text page; 0 if none.
pub fn sample(page: &str, name: &str, labels: &[&str]) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix(name))
        .filter(|rest| rest.starts_with('{') || rest.starts_with(' '))
        .find(|rest| labels.iter().all(|label| rest.contains(label)))
        .and_then(|rest| rest.rsplit(' ').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
