//! Storage: a default StorageClass `local` and local PersistentVolumes of 1 GiB on each node
//! (`VOLUMES` in all, at least `MIN_PER_NODE` a node), each a directory under the node's. No provisioner: a claim binds to a
//! free volume when its pod is scheduled (`WaitForFirstConsumer`); a released volume is kept
//! (`Retain`), as the data of a lock node must not go to another claim.

use crate::Error;
use std::path::PathBuf;

/// Enough for the chart's five Redis nodes and a second release beside them.
const VOLUMES: usize = 12;
const MIN_PER_NODE: usize = 4;

/// Creates the volumes' directories on each (node name, node directory) and returns the
/// manifest.
pub fn manifest(nodes: &[(&str, PathBuf)]) -> Result<String, Error> {
    let per_node = (VOLUMES / nodes.len().max(1)).max(MIN_PER_NODE);
    let mut text = String::from(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: local\n  annotations: {storageclass.kubernetes.io/is-default-class: \"true\"}\nprovisioner: kubernetes.io/no-provisioner\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Retain\n",
    );
    let volumes = nodes
        .iter()
        .enumerate()
        .flat_map(|(k, (name, dir))| (0..per_node).map(move |i| (k, i, *name, dir)));
    for (k, i, node_name, node_dir) in volumes {
        let dir = node_dir.join("volumes").join(format!("local-{i}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create a volume's directory", e))?;
        text.push_str(&format!(
            r#"---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: local-{k}-{i}}}
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
