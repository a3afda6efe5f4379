//! Storage: a default StorageClass `local` and `VOLUMES` local PersistentVolumes of 1 GiB on
//! the node, each a directory under the node's directory. No provisioner: a claim binds to a
//! free volume when its pod is scheduled (`WaitForFirstConsumer`); a released volume is kept
//! (`Retain`), as the data of a lock node must not go to another claim.

use crate::Error;
use std::path::Path;

/// Enough for the chart's five Redis nodes and a second release beside them.
pub const VOLUMES: usize = 12;

/// Creates the volumes' directories and returns the manifest.
pub fn manifest(node_dir: &Path, node_name: &str) -> Result<String, Error> {
    let mut text = String::from(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: local\n  annotations: {storageclass.kubernetes.io/is-default-class: \"true\"}\nprovisioner: kubernetes.io/no-provisioner\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Retain\n",
    );
    for i in 0..VOLUMES {
        let dir = node_dir.join("volumes").join(format!("local-{i}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create a volume's directory", e))?;
        text.push_str(&format!(
            r#"---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: local-{i}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  local: {{path: {path}}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: In, values: [{node_name}]}}
"#,
            path = dir.display()
        ));
    }
    Ok(text)
}
