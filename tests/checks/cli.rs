//! The command line as users run it, with nothing but the binary: `lockedjob next` on expressions,
//! the shell completion scripts checked by their shells, and a bad operator flag refused.

use testsupport as support;

use std::process::Command;
use support::{lockedjob, text};

#[test]
fn next_prints_the_coming_times_and_rejects_bad_expressions_clearly() {
    let out = lockedjob(&["next", "*/20 * * * *", "-n", "3"])
        .args(["--after", "2026-01-01T10:05:00Z"])
        .output()
        .expect("run next");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "2026-01-01T10:20:00Z\n2026-01-01T10:40:00Z\n2026-01-01T11:00:00Z\n"
    );
    let zoned = lockedjob(&["next", "0 9 * * *", "--time-zone", "America/New_York"])
        .args(["-n", "1", "--after", "2026-07-01T00:00:00Z"])
        .output()
        .expect("run next");
    assert_eq!(
        String::from_utf8_lossy(&zoned.stdout),
        "2026-07-01T09:00:00-04:00 EDT  (2026-07-01T13:00:00Z)\n"
    );
    for (args, named) in [
        (vec!["next", "61 * * * *"], "not a valid cron expression"),
        (
            vec!["next", "0 9 * * *", "--time-zone", "Mars/Olympus"],
            "unknown time zone",
        ),
    ] {
        let out = lockedjob(&args).output().expect("run next");
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(named), "{args:?}: {}", text(&out));
    }
}

/// Each script is accepted by its shell (bash and zsh parse it without running; fish is not
/// installed here, so its script is only checked for its completions).
#[test]
fn completion_scripts_parse_in_their_shells() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (shell, check) in [("bash", Some("bash")), ("zsh", Some("zsh")), ("fish", None)] {
        let out = lockedjob(&["completions", shell]).output().expect("run");
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout).into_owned();
        for subcommand in ["exec", "operator", "status", "next", "completions"] {
            assert!(
                script.contains(subcommand),
                "{shell} script lacks {subcommand}"
            );
        }
        let Some(program) = check else { continue };
        let available = Command::new("sh")
            .args(["-c", &format!("command -v {program}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !available {
            // CI installs every shell it checks; elsewhere the test says what it left out.
            assert!(
                std::env::var("CI").is_err(),
                "{program} is not installed, and CI must parse its script (scripts/test.sh installs it)"
            );
            eprintln!("left out: {program} is not installed, so its script is not parsed");
            continue;
        }
        let path = dir.path().join(format!("lockedjob.{shell}"));
        std::fs::write(&path, &script).expect("write script");
        let parsed = Command::new(program)
            .arg("-n")
            .arg(&path)
            .output()
            .expect("run the shell");
        assert!(parsed.status.success(), "{shell}: {}", text(&parsed));
    }
    let bad = lockedjob(&["completions", "cmd.exe"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(64), "{}", text(&bad));
}

#[test]
fn operator_refuses_a_lock_node_that_is_not_namespace_slash_statefulset() {
    let bad = lockedjob(&[
        "operator",
        "--redis",
        "redis://127.0.0.1:1",
        "--roll-lock-nodes",
        "lockedjob/locks-redis-0,locks-redis-1",
    ])
    .output()
    .expect("run lockedjob operator");
    let said = text(&bad);
    assert_eq!(bad.status.code(), Some(64), "{said}");
    assert!(
        said.contains("--roll-lock-nodes")
            && said.contains("\"locks-redis-1\" is not NAMESPACE/STATEFULSET"),
        "{said}"
    );
}
