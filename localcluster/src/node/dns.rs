//! Cluster DNS: CoreDNS as a Deployment in kube-system behind the `kube-dns` Service at the
//! address the kubelet hands to pods. It answers for `cluster.local` (and reverse lookups)
//! only: there is no `forward`, so no query leaves the machine; other names are refused at
//! once.

use super::network::Subnets;

pub fn manifest(subnets: &Subnets, image: &str) -> String {
    let dns_ip = subnets.dns_ip();
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects:
- {{kind: ServiceAccount, name: coredns, namespace: kube-system}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:53 {{
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
            pods insecure
            ttl 30
        }}
        cache 30
        loop
        reload
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: 1
  selector:
    matchLabels: {{k8s-app: kube-dns}}
  template:
    metadata:
      labels: {{k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      containers:
      - name: coredns
        image: {image}
        imagePullPolicy: IfNotPresent
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {{name: dns, containerPort: 53, protocol: UDP}}
        - {{name: dns-tcp, containerPort: 53, protocol: TCP}}
        resources:
          requests: {{cpu: 50m, memory: 32Mi}}
          limits: {{memory: 128Mi}}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {{drop: [ALL], add: [NET_BIND_SERVICE]}}
        readinessProbe:
          httpGet: {{path: /ready, port: 8181}}
          periodSeconds: 2
        livenessProbe:
          httpGet: {{path: /health, port: 8080}}
        volumeMounts:
        - {{name: config, mountPath: /etc/coredns, readOnly: true}}
      volumes:
      - name: config
        configMap: {{name: coredns}}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  clusterIP: {dns_ip}
  selector: {{k8s-app: kube-dns}}
  ports:
  - {{name: dns, port: 53, protocol: UDP, targetPort: 53}}
  - {{name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}}
"#
    )
}
