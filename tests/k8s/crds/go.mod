// The operators whose CRDs the manifests of contrib/kubernetes are validated against
// (tests/k8s): a Go module only to pin them, with their content hashes in go.sum.
// scripts/setup.sh fetches them into .cache/go (go mod download); nothing here is built.
//   KMM v1.1.0: the newest tag the module proxy serves (later tags are not Go modules)
//   NTO 2023-12-25: the newest pseudo-version with a checksum-database entry
//   Prometheus Operator v0.94.1
module kbp.invalid/crdschemas

go 1.19

require (
	github.com/kubernetes-sigs/kernel-module-management v1.1.0
	github.com/openshift/cluster-node-tuning-operator v0.0.0-20231225123609-e63d2c9626fe
	github.com/prometheus-operator/prometheus-operator v0.94.1
)
