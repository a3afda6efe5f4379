//! kubectl against the stand-in: apply the CRD and the examples, get them back.
//! Skipped, with a visible message, where kubectl is not installed.

mod standin;

use std::process::Command;

fn kubectl_available() -> bool {
    Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String) {
    let mut command = Command::new("kubectl");
    command.arg("--kubeconfig").arg(kubeconfig).args(args);
    if args[0] == "apply" {
        // The stand-in serves no OpenAPI documents, which kubectl's client-side validation
        // downloads; the server still enforces the CRD schema on every write.
        command.arg("--validate=false");
    }
    let out = command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn kubectl_applies_the_crd_and_examples_and_gets_them() {
    if !kubectl_available() {
        println!("skipped: kubectl not installed (apt-get install kubernetes-client)");
        return;
    }
    let server = standin::ApiServer::start();
    let kubeconfig = server.kubeconfig();
    for args in [
        vec!["apply", "-f", "crds/lockedjob.dev_lockedjobs.yaml"],
        vec!["apply", "-f", "examples/nightly-report.yaml"],
        vec!["apply", "-f", "examples/sweep-every-5-minutes.yaml"],
        vec!["apply", "-f", "examples/cross-cluster.yaml"],
        // A second apply of the same file is an update, not a conflict.
        vec!["apply", "-f", "examples/nightly-report.yaml"],
    ] {
        let (ok, text) = kubectl(&kubeconfig, &args);
        assert!(ok, "kubectl {args:?}: {text}");
    }
    let (ok, text) = kubectl(&kubeconfig, &["get", "lj", "-A"]);
    assert!(ok, "{text}");
    for expected in [
        "nightly-report",
        "billing-sweep",
        "cache-rebuild",
        "SCHEDULE",
        "*/5 * * * *",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let (ok, text) = kubectl(&kubeconfig, &["get", "jobs", "-A"]);
    assert!(ok, "{text}");
    let (ok, text) = kubectl(
        &kubeconfig,
        &[
            "get",
            "lockedjob",
            "nightly-report",
            "-o",
            "jsonpath={.spec.concurrencyPolicy}",
        ],
    );
    assert!(ok, "{text}");
    assert_eq!(text, "Forbid", "defaults applied by the schema");
    let (ok, text) = kubectl(
        &kubeconfig,
        &["apply", "-f", "examples/invalid/restart-always.yaml"],
    );
    assert!(
        ok,
        "schema-valid manifest is accepted by the API (the operator reports InvalidSpec): {text}"
    );
}
