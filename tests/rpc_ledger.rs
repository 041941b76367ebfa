//! The RPC ledger (`src/router/ledger.tsv`): every RPC path Cursor's client knows is passed,
//! served here or refused, with a reason, and the router decides each one as the ledger says.
//!
//! Cursor's path list is `tests/fixtures/protocol/services-paths.txt` (a copy of the first
//! column of `../shared/protocol/services.tsv`); where `../shared` is present, its list is read
//! too and the copy must match it.

#[path = "common/skip.rs"]
mod skip;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use cursor_byok::router::{route, LEDGER};

struct Entry {
    class: String,
    route: String,
    reason: String,
}

fn ledger() -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    for (i, line) in LEDGER.lines().enumerate().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 4, "ledger line {}: four columns: {line}", i + 1);
        let entry = Entry {
            class: cols[1].to_string(),
            route: cols[2].to_string(),
            reason: cols[3].to_string(),
        };
        assert!(
            out.insert(cols[0].to_string(), entry).is_none(),
            "ledger line {}: {} listed twice",
            i + 1,
            cols[0]
        );
    }
    out
}

fn fixture_paths() -> BTreeSet<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/protocol/services-paths.txt");
    std::fs::read_to_string(path)
        .expect("the fixture copy of Cursor's path list")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn shared_paths() -> Option<BTreeSet<String>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/protocol/services.tsv");
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .skip(1)
            .filter_map(|l| l.split('\t').next())
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// Does `route` (the router's decision, `Debug` form) carry out `class`?
fn agrees(class: &str, route: &str) -> bool {
    let refused = route == "Cursor(WsProbe)" || route == "Own";
    match class {
        "pass" => route == "Upstream",
        "refused" => refused,
        "served" => route != "Upstream" && !refused,
        _ => false,
    }
}

#[test]
fn every_cursor_rpc_is_in_the_ledger() {
    let ledger = ledger();
    let missing: Vec<_> = fixture_paths()
        .into_iter()
        .filter(|p| !ledger.contains_key(p))
        .collect();
    assert!(
        missing.is_empty(),
        "paths in Cursor's service list that the ledger (src/router/ledger.tsv) does not \
         classify: {missing:#?}"
    );
}

#[test]
fn the_ledger_agrees_with_shared_when_present() {
    let Some(shared) = shared_paths() else {
        skip::skipped(
            "the_ledger_agrees_with_shared_when_present",
            "../shared/protocol/services.tsv is absent; the fixture copy was checked",
        );
        return;
    };
    let ledger = ledger();
    let missing: Vec<_> = shared.iter().filter(|p| !ledger.contains_key(*p)).collect();
    assert!(
        missing.is_empty(),
        "unclassified in ../shared: {missing:#?}"
    );
    let fixture = fixture_paths();
    let stale: Vec<_> = shared.symmetric_difference(&fixture).collect();
    assert!(
        stale.is_empty(),
        "tests/fixtures/protocol/services-paths.txt differs from ../shared (refresh it as its \
         README says): {stale:#?}"
    );
}

#[test]
fn the_router_decides_every_path_as_the_ledger_says() {
    let mut wrong = Vec::new();
    for (path, e) in ledger() {
        let got = format!("{:?}", route(&path));
        if got != e.route {
            wrong.push(format!(
                "{path}: ledger says {}, router says {got}",
                e.route
            ));
        }
        if !agrees(&e.class, &e.route) {
            wrong.push(format!("{path}: class {} but route {}", e.class, e.route));
        }
        if e.reason.trim().len() < 10 {
            wrong.push(format!("{path}: no reason given"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_side_calls_are_served_here() {
    let ledger = ledger();
    for path in [
        "/agent.v1.AgentService/NameAgent",
        "/aiserver.v1.AiService/NameAgent",
        "/agent.v1.AgentService/CreateTranscriptOverview",
        "/agent.v1.AgentService/UpdateConversationMetadata",
        "/agent.v1.AgentService/NotifyConversationClone",
        "/agent.v1.AgentService/UploadConversationBlobs",
        "/aiserver.v1.AnalyticsService/IngestConversation",
        "/aiserver.v1.AiService/NameTab",
        "/aiserver.v1.AiService/PotentiallyGenerateMemory",
    ] {
        let e = &ledger[path];
        assert_eq!(e.class, "served", "{path}");
        assert!(e.route.starts_with("Side("), "{path}: {}", e.route);
    }
}

#[test]
fn a_path_in_no_list_fails_the_check() {
    // The check itself: a made-up path is unclassified.
    let ledger = ledger();
    assert!(!ledger.contains_key("/agent.v1.AgentService/SomethingNew"));
    assert!(!agrees("pass", "Side(NameAgent)"));
    assert!(!agrees("served", "Upstream"));
    assert!(!agrees("refused", "Upstream"));
}
