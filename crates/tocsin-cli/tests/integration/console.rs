//! The web console (`/ui`) in a real browser: headless Chromium (Debian's
//! `chromium`, installed by `.ci/setup`) loads each page from a live node,
//! the test checks what the rendered DOM says against what the API says,
//! and saves a screenshot of each page (to `$CARGO_TARGET_TMPDIR/console`,
//! or the directory `TOCSIN_CONSOLE_SCREENSHOTS` names: the ones in
//! `docs/console/` were taken that way).

use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

use tocsin_client::Client;
use tocsin_client::v1 as pb;

use crate::support::NodeProcess;
use crate::support::Receiver;
use crate::support::free_ports;

/// Chromium, headless, with a profile of its own; as root it needs
/// `--no-sandbox`.
fn chromium(profile: &Path, args: &[&str]) -> std::process::Output {
    let bin = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok())
        .expect("headless Chromium is needed for the console test: apt-get install chromium (bash .ci/setup does)");
    let out = Command::new(bin)
        .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("chromium runs");
    assert!(out.status.success(), "chromium {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// The page's DOM after Chromium rendered it.
fn dom(profile: &Path, url: &str) -> String {
    String::from_utf8(chromium(profile, &["--dump-dom", url]).stdout).unwrap()
}

fn screenshot(profile: &Path, url: &str, file: &Path) {
    chromium(profile, &[&format!("--screenshot={}", file.display()), "--window-size=1280,1000", url]);
    let png = std::fs::read(file).expect("a screenshot was written");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{}: {} bytes", file.display(), png.len());
}

/// The text inside the element with `id` (its first text node).
fn text_of(dom: &str, id: &str) -> String {
    let at = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in the page"));
    let start = at + dom[at..].find('>').unwrap() + 1;
    dom[start..start + dom[start..].find('<').unwrap()].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_pages_render_in_headless_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(dir.path(), &[]);
    let client = Client::connect([node.grpc.clone()]).await.unwrap();
    let receiver = Receiver::start().await;
    let closed_port = free_ports(1)[0];

    // Phase: a namespace with 120 timers over the next hour, one delivered,
    // one DEAD after its only attempt failed, and one whose id is markup.
    let mut reqs: Vec<_> = (0..120)
        .map(|i| tocsin_client::webhook_timer("shop", &format!("later-{i}"), 120_000 + i * 25_000, &receiver.url))
        .collect();
    reqs.push(tocsin_client::webhook_timer("shop", "ok-1", 300, &receiver.url));
    let mut doomed =
        tocsin_client::webhook_timer("shop", "doomed", 300, &format!("http://127.0.0.1:{closed_port}/hook"));
    doomed.retry = Some(pb::RetryPolicy { max_attempts: 1, ..Default::default() });
    reqs.push(doomed);
    // Half an hour out, well inside the next hour: a timer at the hour's
    // very edge entered the horizon's window between the API's read and the
    // page's, and the two counts differed by one (a CI run, 2026-11-27).
    reqs.push(tocsin_client::webhook_timer("shop", "<script>alert(1)</script>", 1_800_000, &receiver.url));
    assert!(client.create_timers(reqs).await.iter().all(Result::is_ok));
    let mut settled = false;
    for _ in 0..100 {
        let dead = client.get_timer("shop", "doomed").await.unwrap().state == pb::timer::State::Dead as i32;
        let done = client.get_timer("shop", "ok-1").await.unwrap().state == pb::timer::State::Delivered as i32;
        if dead && done {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(settled, "ok-1 delivered and doomed DEAD within 10 s");

    let profile = dir.path().join("chromium-profile");
    let shots = std::env::var_os("TOCSIN_CONSOLE_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console"));
    std::fs::create_dir_all(&shots).unwrap();
    let base = format!("http://{}", node.http);

    // Phase: the cluster page lists the node and every shard, each led.
    let url = format!("{base}/ui");
    let page = dom(&profile, &url);
    assert!(page.contains("<h1>Cluster"), "{page}");
    assert!(page.contains(&node.grpc), "the node's gRPC address");
    let shard_rows = page.matches("<td>node 1</td>").count();
    assert_eq!(shard_rows, 8, "8 shards, each led by node 1");
    assert!(!page.contains(">none<"), "a shard without a leader");
    screenshot(&profile, &url, &shots.join("cluster.png"));

    // Phase: the namespace page's horizon matches the API's, its chart
    // holds 60 minutes whose counts add up to the next hour's, and its DEAD
    // table names the DEAD timer and no other.
    let horizon = client.horizon("shop").await.unwrap();
    let url = format!("{base}/ui/namespaces/shop");
    let page = dom(&profile, &url);
    assert_eq!(text_of(&page, "next-hour"), horizon.next_hour.to_string());
    assert!(horizon.next_hour >= 100, "{horizon:?}");
    let bars: Vec<u64> = page
        .split("<title>+")
        .skip(1)
        .map(|t| t.split(": ").nth(1).unwrap().split('<').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(bars.len(), 60, "a bar per minute");
    assert_eq!(bars.iter().sum::<u64>(), horizon.next_hour);
    assert!(page.contains("/ui/timers/shop/doomed"), "the DEAD timer is listed");
    assert!(!page.contains("/ui/timers/shop/ok-1"), "a delivered timer is not DEAD");
    assert!(text_of(&page, "lateness").starts_with("p50"), "fires were led here: {}", text_of(&page, "lateness"));
    screenshot(&profile, &url, &shots.join("namespace.png"));

    // Phase: the timer page shows the DEAD timer's state and failed attempt.
    let url = format!("{base}/ui/timers/shop/doomed");
    let page = dom(&profile, &url);
    assert_eq!(text_of(&page, "state"), "DEAD");
    assert!(page.contains("id=\"attempts\""), "the attempt history");
    assert!(page.contains("MAX_ATTEMPTS"), "why it is DEAD");
    screenshot(&profile, &url, &shots.join("timer.png"));
    let page = dom(&profile, &format!("{base}/ui/timers/shop/ok-1"));
    assert_eq!(text_of(&page, "state"), "DELIVERED");
    assert!(page.contains("<td class=\"num\">200</td>"), "the receiver's 200 in the history");

    // Phase: search. By id, to the timer's page; by state, a list; markup
    // in an id stays text (no script element comes of it).
    let page = dom(&profile, &format!("{base}/ui/search?namespace=shop&id=ok-1"));
    assert_eq!(text_of(&page, "timer-id"), "ok-1");
    let url = format!("{base}/ui/search?namespace=shop&state=SCHEDULED");
    let page = dom(&profile, &url);
    // One page of the API's listing: at most 100, and it says there is more.
    let shown = page.matches("/ui/timers/shop/later-").count();
    assert!((1..=100).contains(&shown), "{shown} scheduled timers shown");
    assert!(page.contains("the rest with"), "121 are scheduled: the page says there are more");
    assert!(!page.contains("/ui/timers/shop/doomed"), "only SCHEDULED ones");
    screenshot(&profile, &url, &shots.join("search.png"));
    let page = dom(&profile, &format!("{base}/ui/search?namespace=shop&id=%3Cscript%3Ealert(1)%3C%2Fscript%3E"));
    assert_eq!(text_of(&page, "state"), "SCHEDULED", "the markup id's timer was found");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the markup id, as text");
    assert!(!page.contains("<script>"), "no script element from client input");

    // Phase: a missing timer is a page that says NOT_FOUND, with status 404.
    let page = dom(&profile, &format!("{base}/ui/timers/shop/nope"));
    assert!(page.contains("NOT_FOUND"), "{page}");
    let http = tocsin_contract::tls::http_client_builder().build().unwrap();
    let status = http.get(format!("{base}/ui/timers/shop/nope")).send().await.unwrap().status();
    assert_eq!(status.as_u16(), 404);
}
