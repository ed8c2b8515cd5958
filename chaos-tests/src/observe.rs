//! What the harness reads off the processes besides the records: the
//! nodes' Prometheus metrics (histogram quantiles between two scrapes),
//! their peak memory (`VmHWM`), and the sink's control endpoint.

use std::time::Duration;

use anyhow::Context;
use anyhow::bail;

fn http() -> reqwest::Client {
    // reqwest is built without a TLS provider (see the workspace manifest);
    // install ring's before the first client. Err: one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Every node call carries the harness's token (probes and metrics need
    // none; the receivers ignore it).
    let mut headers = reqwest::header::HeaderMap::new();
    let bearer = format!("Bearer {}", crate::cluster::BOOTSTRAP_TOKEN);
    headers.insert(reqwest::header::AUTHORIZATION, bearer.parse().expect("an ASCII token"));
    reqwest::Client::builder().timeout(Duration::from_secs(5)).default_headers(headers).build().expect("an HTTP client")
}

/// GETs `url`'s body.
pub async fn get(url: &str) -> anyhow::Result<String> {
    let resp = http().get(url).send().await.with_context(|| format!("GET {url}"))?;
    if !resp.status().is_success() {
        bail!("GET {url}: {}", resp.status());
    }
    Ok(resp.text().await?)
}

/// GETs `url`: its status and body, whatever the status.
pub async fn get_status(url: &str) -> anyhow::Result<(u16, String)> {
    let resp = http().get(url).send().await.with_context(|| format!("GET {url}"))?;
    Ok((resp.status().as_u16(), resp.text().await?))
}

/// POSTs `body` to `url`.
pub async fn post(url: &str, body: &str) -> anyhow::Result<String> {
    let resp = http().post(url).body(body.to_string()).send().await.with_context(|| format!("POST {url}"))?;
    let status = resp.status();
    let text = resp.text().await?;
    if !status.is_success() {
        bail!("POST {url}: {status}: {text}");
    }
    Ok(text)
}

/// A Prometheus histogram's cumulative buckets (`le`, count).
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub count: f64,
}

impl Histogram {
    /// `name`'s buckets in a `/metrics` text (label sets other than `le`
    /// summed).
    pub fn parse(text: &str, name: &str) -> Histogram {
        let mut h = Histogram::default();
        let bucket = format!("{name}_bucket{{");
        let count = format!("{name}_count");
        for line in text.lines() {
            let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else { continue };
            if line.starts_with(&bucket) {
                let le = label(line, "le").unwrap_or("");
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
                match h.buckets.iter_mut().find(|(l, _)| *l == le) {
                    Some(b) => b.1 += value,
                    None => h.buckets.push((le, value)),
                }
            } else if line.starts_with(&count) {
                h.count += value;
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        h
    }

    /// The `q` quantile of what was recorded between `before` and `self`,
    /// as the upper bound of its bucket (seconds); `None` if nothing was.
    pub fn quantile_since(&self, before: &Histogram, q: f64) -> Option<f64> {
        let at = |h: &Histogram, le: f64| h.buckets.iter().find(|(l, _)| *l == le).map_or(0.0, |(_, c)| *c);
        let total = self.count - before.count;
        if total <= 0.0 {
            return None;
        }
        self.buckets.iter().find(|(le, c)| c - at(before, *le) >= q * total).map(|(le, _)| *le)
    }

    pub fn count_since(&self, before: &Histogram) -> f64 {
        self.count - before.count
    }
}

/// Whether a `/metrics` line is a sample of metric `name` (not of one
/// whose name merely starts with it).
fn is_series_of(line: &str, name: &str) -> bool {
    line.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
}

/// The value of label `name` in a `/metrics` line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(&format!("{name}=\"")).nth(1)?.split('"').next()
}

/// The sum of a counter's values over its label sets in a `/metrics` text.
pub fn counter_sum(text: &str, name: &str) -> f64 {
    text.lines().filter(|l| is_series_of(l, name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// Scrapes a node's `/metrics` (HTTP address `host:port`).
pub async fn metrics(http_addr: &str) -> anyhow::Result<String> {
    get(&format!("http://{http_addr}/metrics")).await
}

/// A process's peak resident memory (`VmHWM`), in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time a process has used so far (user + system), in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are fixed.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(ticks as f64 / 100.0)
}

/// CPU use of some processes over an interval: start it, then `report`.
pub struct CpuWatch {
    started: std::time::Instant,
    at_start: Vec<(String, u32, f64)>,
}

impl CpuWatch {
    /// `(name, pid)` of each process to watch.
    pub fn start(processes: Vec<(String, u32)>) -> CpuWatch {
        let at_start = processes.into_iter().filter_map(|(name, pid)| Some((name, pid, cpu_seconds(pid)?))).collect();
        CpuWatch { started: std::time::Instant::now(), at_start }
    }

    /// Each process's CPU use since `start`, as a share of one core.
    pub fn report(&self) -> String {
        let wall = self.started.elapsed().as_secs_f64().max(0.001);
        self.at_start
            .iter()
            .filter_map(|(name, pid, before)| {
                Some(format!("{name} {:.0}%", (cpu_seconds(*pid)? - before) / wall * 100.0))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Counters the timeline follows: why creates were refused, how client
/// calls and the items of batched creates were answered, and what moved
/// leaderships or abandoned attempts.
/// (A create the client retried after a refusal shows only as a late
/// acknowledgement in the records; these say which refusal it was.)
const TIMELINE_COUNTERS: &[&str] = &[
    "tocsin_creates_shed_total",
    "tocsin_grpc_requests_total",
    "tocsin_create_items_refused_total",
    "tocsin_forwarded_requests_total",
    "tocsin_stale_map_refusals_total",
    "tocsin_leader_changes_total",
    "tocsin_attempts_abandoned_total",
];

/// The series of `TIMELINE_COUNTERS` in a `/metrics` text: (series with
/// its labels, value).
fn timeline_series(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| TIMELINE_COUNTERS.iter().any(|name| is_series_of(l, name)))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Samples some counters of every node once a second into
/// `counters.ndjson` (a line per series whose value changed: `t_ms`,
/// `node`, `series`, `value`), so that a stall in a run's records can be
/// matched with what the nodes refused meanwhile.
pub struct CounterTimeline {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: Option<tokio::task::JoinHandle<std::collections::BTreeMap<(String, String), f64>>>,
}

/// A run that ends early (an error) stops the sampling too: it must not
/// scrape the next scenario's nodes into this one's file.
impl Drop for CounterTimeline {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl CounterTimeline {
    /// `(name, http address)` of each node.
    pub fn start(nodes: Vec<(String, String)>, path: std::path::PathBuf) -> CounterTimeline {
        use std::io::Write;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut last: std::collections::BTreeMap<(String, String), f64> = std::collections::BTreeMap::new();
            let mut out = std::fs::File::create(&path).ok().map(std::io::BufWriter::new);
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let t_ms = crate::driver::now_ms();
                for (node, http) in &nodes {
                    // A node that is down (killed, frozen) is skipped.
                    let Ok(Ok(text)) = tokio::time::timeout(Duration::from_millis(900), metrics(http)).await else {
                        continue;
                    };
                    for (series, value) in timeline_series(&text) {
                        let key = (node.clone(), series);
                        if last.get(&key) != Some(&value) {
                            if let Some(out) = out.as_mut() {
                                let line =
                                    serde_json::json!({"t_ms": t_ms, "node": key.0, "series": key.1, "value": value});
                                let _ = writeln!(out, "{line}");
                            }
                            last.insert(key, value);
                        }
                    }
                }
            }
            if let Some(mut out) = out {
                let _ = out.flush();
            }
            last
        });
        CounterTimeline { stop, task: Some(task) }
    }

    /// Stops sampling; the creates each node shed, by reason, as a line
    /// for the run's output (`none` if no node shed any).
    pub async fn finish(mut self) -> String {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let last = match self.task.take() {
            Some(task) => task.await.unwrap_or_default(),
            None => Default::default(),
        };
        let shed: Vec<String> = last
            .iter()
            .filter(|((_, series), value)| series.starts_with("tocsin_creates_shed_total") && **value > 0.0)
            .map(|((node, series), value)| {
                let reason = label(series, "reason").unwrap_or("?");
                format!("{node} {reason} {value}")
            })
            .collect();
        if shed.is_empty() { "none".into() } else { shed.join(", ") }
    }
}

/// Sets modes on a `tocsin sink` (`PREFIX=MODE` lines) through its control
/// endpoint at `base` (`http://host:port`).
pub async fn sink_modes(base: &str, lines: &[&str]) -> anyhow::Result<()> {
    post(&format!("{base}/_sink/mode"), &lines.join("\n")).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_keeps_only_its_counters() {
        let text = "# HELP tocsin_creates_shed_total x\n\
                    tocsin_creates_shed_total{reason=\"queue_delay\"} 12\n\
                    tocsin_creates_shed_total_other 3\n\
                    tocsin_grpc_requests_total{method=\"CreateTimers\",code=\"Ok\"} 40\n\
                    tocsin_pending_timers 7\n";
        assert_eq!(
            timeline_series(text),
            vec![
                ("tocsin_creates_shed_total{reason=\"queue_delay\"}".to_string(), 12.0),
                ("tocsin_grpc_requests_total{method=\"CreateTimers\",code=\"Ok\"}".to_string(), 40.0),
            ]
        );
    }

    #[test]
    fn quantiles_between_scrapes() {
        let before = Histogram::parse(
            "x_bucket{le=\"0.001\"} 10\nx_bucket{le=\"0.01\"} 10\nx_bucket{le=\"0.1\"} 10\nx_bucket{le=\"+Inf\"} 10\nx_count 10\n",
            "x",
        );
        let after = Histogram::parse(
            "x_bucket{le=\"0.001\"} 10\nx_bucket{le=\"0.01\"} 60\nx_bucket{le=\"0.1\"} 109\nx_bucket{le=\"+Inf\"} 110\nx_count 110\n",
            "x",
        );
        assert_eq!(after.quantile_since(&before, 0.5), Some(0.01));
        assert_eq!(after.quantile_since(&before, 0.99), Some(0.1));
        assert_eq!(after.quantile_since(&after, 0.99), None);
    }
}
