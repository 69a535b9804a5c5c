// Pins the upstream Argo CD release whose CRDs the process cluster serves (read from the module
// cache; `go mod download -json` names the folder). The version kind/ and the charts name.
// Only require and replace lines: the source comes from the Go module proxy.
module gitops-loop.local/real/argocd

go 1.26

require github.com/argoproj/argo-cd/v3 v3.5.1
