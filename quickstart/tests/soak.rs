//! The cluster soak through its binary (root, real nodes): a short soak under the seeded faults
//! passes both checkers, and the broken deployment (each cluster its own lock nodes) with a
//! store that takes every write makes both object, to the runs and to the writes. Each starts
//! two clusters; they run one at a time.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn soak(args: &[&str], out: &Path) -> (Option<i32>, serde_json::Value, String) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = Command::new(env!("CARGO_BIN_EXE_soak"))
        .args(args)
        .arg("--out")
        .arg(out)
        .env("LOCKEDJOB_PORCUPINE_CHECK", independent_checker())
        .output()
        .expect("run soak");
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    let report = std::fs::read_to_string(out.join("report.json"))
        .unwrap_or_else(|e| panic!("report.json: {e}; the soak said:\n{stderr}"));
    let report = serde_json::from_str(&report).expect("report.json is JSON");
    (run.status.code(), report, stderr)
}

/// `tools/porcupine-check`, as `scripts/test.sh` built it, or built now.
fn independent_checker() -> String {
    if let Ok(path) = std::env::var("LOCKEDJOB_PORCUPINE_CHECK") {
        return path;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/porcupine-check.sh");
    let built = Command::new(script)
        .output()
        .expect("run scripts/porcupine-check.sh");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    String::from_utf8_lossy(&built.stdout)
        .lines()
        .last()
        .expect("the checker's path")
        .to_string()
}

fn strings(report: &serde_json::Value, field: &str) -> Vec<String> {
    report[field]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn a_short_soak_under_seeded_faults_passes_both_checkers() {
    let out = tempfile::tempdir().expect("a temp dir");
    let (code, report, stderr) = soak(&["--minutes", "3", "--seed", "28"], out.path());
    assert_eq!(code, Some(0), "the soak failed:\n{stderr}");
    let picture = std::fs::read_to_string(out.path().join("timeline.svg")).unwrap_or_default();
    assert!(
        picture.matches("<rect").count() > 20,
        "the timeline draws the runs"
    );
    let planned = report["schedule"].as_array().map(Vec::len).unwrap_or(0);
    let faults = report["faults"].as_array().cloned().unwrap_or_default();
    assert!(
        planned >= 5 && faults.len() == planned,
        "{planned} planned, {} carried out",
        faults.len()
    );
    let hit = faults
        .iter()
        .filter(|f| {
            !f["target"]
                .as_str()
                .unwrap_or("nothing")
                .starts_with("nothing")
        })
        .count();
    assert!(hit * 2 >= planned, "most faults hit something:\n{stderr}");
    let locks = report["locks"].as_array().cloned().unwrap_or_default();
    assert_eq!(locks.len(), 4);
    for lock in &locks {
        assert!(
            lock["runs"]["scheduled"].as_u64().unwrap_or(0) > 0,
            "{lock}"
        );
        assert!(lock["writes"].as_u64().unwrap_or(0) > 0, "{lock}");
    }
    let ran = |kind: &str| {
        locks
            .iter()
            .any(|l| l["runs"][kind].as_u64().unwrap_or(0) > 0)
    };
    assert!(
        ran("run-now") && ran("backfill"),
        "the run-now and the backfill ran:\n{stderr}"
    );
    let requests = report["requests"].as_array().cloned().unwrap_or_default();
    assert!(
        requests.len() == 2 && requests.iter().all(|r| r["first_run_after_s"].is_number()),
        "each request ran after it was made: {requests:?}"
    );
    let independent = report["independent"]
        .as_object()
        .map(|o| o.len())
        .unwrap_or(0);
    assert_eq!(
        independent, 5,
        "porcupine judged every lock and the leader's writes"
    );
    let leader = &report["leader"];
    assert!(
        leader["terms"].as_u64().unwrap_or(0) >= 1 && leader["writes"].as_u64().unwrap_or(0) > 10,
        "the leader Deployment wrote: {leader}"
    );
}

/// The broken deployment (each cluster its own lock nodes, so both run every time) with the
/// broken build of the work (a store that takes every write): our checker finds times run
/// twice and stale writes taken, porcupine's one-holder and fenced-store models object, and
/// the two agree. The split counters diverge at the latest with east's run-now, after which
/// every time run in both clusters writes with two tokens.
#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn both_checkers_catch_the_split_deployment_and_the_unfenced_store() {
    let out = tempfile::tempdir().expect("a temp dir");
    let args = [
        "--minutes",
        "1.5",
        "--seed",
        "1",
        "--split-nodes",
        "--unfenced-store",
    ];
    let (code, report, stderr) = soak(&args, out.path());
    assert_eq!(code, Some(1), "the broken deployment passed:\n{stderr}");
    let ours = strings(&report, "ours");
    let porcupine = strings(&report, "porcupine");
    for (said, what) in [
        (&ours, "ran twice"),
        (&ours, "stale writes were accepted"),
        (&porcupine, "one-holder"),
        (&porcupine, "fenced-store"),
    ] {
        assert!(
            said.iter().any(|o| o.contains(what)),
            "no \"{what}\" in ours {ours:?}, porcupine {porcupine:?}"
        );
    }
    assert!(strings(&report, "disagreements").is_empty(), "{report}");
}
