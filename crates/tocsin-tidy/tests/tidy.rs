//! Repository-wide checks. Each one guards an **Architecture Invariant**
//! line of ARCHITECTURE.md or a rule of the brief, so breaking it fails
//! `cargo test` rather than waiting for review.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::path::Path;
use std::path::PathBuf;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Normal (not dev, not build) dependencies of every package, by name.
fn dependency_graph() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", "x86_64-unknown-linux-gnu"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let name_of: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let mut graph = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let name = name_of[node["id"].as_str().unwrap()].to_string();
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null()))
            .map(|d| name_of[d["pkg"].as_str().unwrap()].to_string())
            .collect();
        graph.insert(name, deps);
    }
    graph
}

fn closure(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(n) = stack.pop() {
        for d in graph.get(&n).into_iter().flatten() {
            if seen.insert(d.clone()) {
                stack.push(d.clone());
            }
        }
    }
    seen
}

/// The dependency direction of ARCHITECTURE.md, checked on the resolved
/// graph (transitively, normal dependencies only).
#[test]
fn dependency_direction() {
    let graph = dependency_graph();
    let deps = |c: &str| closure(&graph, c);
    let heavy = ["librocksdb-sys", "rocksdb", "tonic", "openraft", "tokio", "hyper"];

    assert!(
        deps("tocsin-wheel").is_empty(),
        "tocsin-wheel must use the standard library only: {:?}",
        deps("tocsin-wheel")
    );
    for banned in heavy {
        assert!(!deps("tocsin-core").contains(banned), "tocsin-core links {banned}");
    }
    for banned in ["librocksdb-sys", "rocksdb", "openraft"] {
        assert!(!deps("tocsin-client").contains(banned), "tocsin-client links {banned}");
        assert!(!deps("tocsin-proto").contains(banned), "tocsin-proto links {banned}");
    }
    // Internal layering: each crate may only use the ones listed.
    let allowed: [(&str, &[&str]); 9] = [
        ("tocsin-wheel", &[]),
        ("tocsin-core", &["tocsin-wheel"]),
        ("tocsin-proto", &[]),
        ("tocsin-store", &["tocsin-core"]),
        // The wire contract: no storage, no consensus (see below).
        ("tocsin-contract", &["tocsin-core", "tocsin-proto"]),
        ("tocsin-client", &["tocsin-core", "tocsin-proto", "tocsin-contract"]),
        ("tocsin-node", &["tocsin-wheel", "tocsin-core", "tocsin-proto", "tocsin-contract", "tocsin-store"]),
        (
            "tocsin-cli",
            &[
                "tocsin-core",
                "tocsin-proto",
                "tocsin-contract",
                "tocsin-node",
                "tocsin-client",
                "tocsin-wheel",
                "tocsin-store",
            ],
        ),
        // The deterministic simulation: tocsin-core's rules under openraft and
        // turmoil, never the RocksDB store nor the gRPC node.
        ("tocsin-sim", &["tocsin-core"]),
    ];
    for banned in ["librocksdb-sys", "rocksdb", "tonic"] {
        assert!(!deps("tocsin-sim").contains(banned), "tocsin-sim links {banned}");
    }
    for (krate, ok) in allowed {
        for dep in graph[krate].iter().filter(|d| d.starts_with("tocsin-")) {
            assert!(ok.contains(&dep.as_str()), "{krate} depends on {dep}, which ARCHITECTURE.md does not allow");
        }
    }
}

fn rust_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("crates"), root().join("chaos-tests")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Every module opens with a `//!` doc saying what it is for.
#[test]
fn every_module_has_a_doc() {
    let missing: Vec<_> = rust_files()
        .into_iter()
        .filter(|p| !std::fs::read_to_string(p).unwrap().trim_start().starts_with("//!"))
        .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(missing.is_empty(), "modules without a //! doc: {missing:#?}");
}

fn files_containing(needle: &str, under: &[&str]) -> Vec<String> {
    rust_files()
        .into_iter()
        .filter(|p| under.iter().any(|u| p.starts_with(root().join(u))))
        .filter(|p| p != &root().join("crates/tocsin-tidy/tests/tidy.rs"))
        .filter(|p| std::fs::read_to_string(p).unwrap().contains(needle))
        .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
        .collect()
}

/// Slow suites are gated by an environment variable, never hidden.
#[test]
fn no_ignored_tests() {
    let found = files_containing(concat!("#[", "ignore"), &["crates", "chaos-tests"]);
    assert!(found.is_empty(), "use an environment variable to gate slow tests: {found:?}");
}

/// The node's HTTP routes are mounted from the route tables only
/// (`api/rest.rs`'s `mount`), which the OpenAPI end-to-end test reads: a
/// route added with axum's own calls would be served undescribed.
#[test]
fn http_routes_come_from_the_tables() {
    for needle in [".route(\"", ".route_service(", ".nest(", ".nest_service("] {
        let found = files_containing(needle, &["crates/tocsin-node/src"]);
        assert!(found.is_empty(), "mount HTTP routes through a table (api/rest.rs): {needle} in {found:?}");
    }
}

/// Shard routing must be stable across Rust releases and platforms.
#[test]
fn no_default_hasher_for_routing() {
    let found = files_containing(concat!("Default", "Hasher"), &["crates"]);
    assert!(found.is_empty(), "DefaultHasher is not stable across releases: {found:?}");
}

/// The pure cores never read a clock: time arrives as `now_ms`.
#[test]
fn pure_cores_read_no_clock() {
    for clock in [concat!("SystemTime", "::now"), concat!("Instant", "::now")] {
        let found = files_containing(clock, &["crates/tocsin-wheel/src", "crates/tocsin-core/src"]);
        assert!(found.is_empty(), "{clock} in a pure core: {found:?}");
    }
    let found = files_containing(concat!("SystemTime", "::now"), &["crates/tocsin-store/src"]);
    assert!(found.is_empty(), "apply must take time from the log entry, not the clock: {found:?}");
}

/// docs/storage.md lists every column family the store creates.
#[test]
fn storage_doc_lists_every_column_family() {
    let doc = std::fs::read_to_string(root().join("docs/storage.md")).expect("docs/storage.md exists");
    let keys = std::fs::read_to_string(root().join("crates/tocsin-store/src/keys.rs")).unwrap();
    let cfs: Vec<&str> =
        keys.lines().filter_map(|l| l.strip_prefix("pub const CF_")).filter_map(|l| l.split('"').nth(1)).collect();
    assert!(cfs.len() >= 7, "found column families {cfs:?}");
    for cf in cfs {
        assert!(doc.contains(&format!("`{cf}`")), "docs/storage.md does not describe column family `{cf}`");
    }
}

/// The module a file of `tocsin-node/src` defines, as a path
/// (`shard/delivery/pull.rs` → `["shard", "delivery", "pull"]`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.pop().expect("a file name");
    match file.as_str() {
        "lib.rs" | "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    parts
}

/// The layer of a module of `tocsin-node`: the base modules (0) import no
/// layer; `shard` (1) only the base; `control` (2) `shard` and the base;
/// `api` (3) all of those; `node` (4), the composition root, anything, and
/// nothing imports it.
fn node_layer(module: &[String]) -> usize {
    match module.first().map(String::as_str) {
        Some("shard") => 1,
        Some("control") => 2,
        Some("api") => 3,
        Some("node") => 4,
        _ => 0,
    }
}

/// Every `crate::` path in `text`, comments left out.
fn crate_paths(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().last();
            rest = &rest[at + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let path: Vec<String> = rest
                .split("::")
                .map_while(|seg| {
                    let ident: String = seg.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    (!ident.is_empty() && ident.len() == seg.len()).then_some(ident)
                })
                .collect();
            // The last segment may be followed by more code (`crate::a::B {`).
            let tail: String = rest
                .split("::")
                .nth(path.len())
                .unwrap_or("")
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let mut path = path;
            if !tail.is_empty() {
                path.push(tail);
            }
            out.push(path);
        }
    }
    out
}

/// ARCHITECTURE.md's layering of `tocsin-node`: no file imports a file of a
/// higher layer, and no two files import each other, directly or through
/// others. Paths are resolved to the longest module prefix that is a file.
#[test]
fn node_layers_point_down_and_files_have_no_cycles() {
    let src = root().join("crates/tocsin-node/src");
    let files: Vec<PathBuf> = rust_files().into_iter().filter(|p| p.starts_with(&src)).collect();
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|p| (module_of(p.strip_prefix(&src).unwrap()), p.strip_prefix(&src).unwrap().display().to_string()))
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap().display().to_string();
        let module = module_of(path.strip_prefix(&src).unwrap());
        let text = std::fs::read_to_string(path).unwrap();
        for line in text.lines().map(str::trim) {
            let code = line.split("//").next().unwrap_or("");
            // Grouped and relative imports would hide edges from this check.
            if code.contains("crate::{") {
                problems.push(format!("{rel}: a grouped `crate::{{…}}` import; write one path per `use`"));
            }
            if code.contains("super::") && code != "use super::*;" {
                problems.push(format!("{rel}: `super::` other than `use super::*;` in a test module: {code}"));
            }
        }
        for p in crate_paths(&text) {
            let target = (1..=p.len()).rev().map(|n| p[..n].to_vec()).find(|m| modules.contains_key(m));
            let Some(target) = target else { continue };
            if target == module || target.is_empty() {
                continue;
            }
            let (from, to) = (node_layer(&module), node_layer(&target));
            if to > from {
                problems.push(format!("{rel} (layer {from}) imports {} (layer {to})", modules[&target]));
            }
            edges.entry(rel.clone()).or_default().insert(modules[&target].clone());
        }
    }
    // Cycles: depth-first search, reporting the first cycle found.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                0 => visit(m, edges, state, stack, cycles),
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    cycles.push(format!("import cycle: {} → {m}", stack[at..].join(" → ")));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if !state.contains_key(n.as_str()) {
            visit(n, &edges, &mut state, &mut Vec::new(), &mut problems);
        }
    }
    assert!(problems.is_empty(), "tocsin-node's layering (ARCHITECTURE.md):\n{}", problems.join("\n"));
    // The check sees the crate: a file of each layer imports something.
    assert!(edges.keys().any(|f| f.starts_with("api/")) && edges.keys().any(|f| f.starts_with("shard/")));
}

/// The wire contract and a webhook receiver link neither RocksDB nor
/// openraft (the CLI's `server` feature is what brings them in).
#[test]
fn the_contract_links_no_storage_or_consensus() {
    let graph = dependency_graph();
    let deps = closure(&graph, "tocsin-contract");
    for banned in ["librocksdb-sys", "rocksdb", "openraft", "tocsin-store", "tocsin-node"] {
        assert!(!deps.contains(banned), "tocsin-contract links {banned}");
    }
    let cli = std::fs::read_to_string(root().join("crates/tocsin-cli/Cargo.toml")).unwrap();
    assert!(
        cli.contains("tocsin-node = { workspace = true, optional = true }")
            && cli.contains("server = [\"dep:tocsin-node\"]"),
        "tocsin-cli must link tocsin-node only through its `server` feature"
    );
    let sink = std::fs::read_to_string(root().join("crates/tocsin-cli/src/sink.rs")).unwrap();
    assert!(!sink.contains("tocsin_node"), "the sink must build without the server");
    // The client-side binary's resolved tree, as `cargo build -p tocsin-cli
    // --no-default-features` would build it.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["tree", "-p", "tocsin-cli", "--no-default-features", "-e", "normal", "--offline", "--prefix", "none"])
        .args(["--target", "x86_64-unknown-linux-gnu"])
        .current_dir(root())
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().any(|l| l.starts_with("tocsin-contract ")), "the tree lists the contract:\n{tree}");
    for banned in ["librocksdb-sys ", "rocksdb ", "openraft ", "tocsin-node ", "tocsin-store "] {
        assert!(!tree.lines().any(|l| l.starts_with(banned)), "a client-side tocsin links {banned}");
    }
}
