// Pins the upstream Kargo release whose CRDs the process cluster serves. The CRDs are read
// from the module cache (`go mod download -json` names the folder); nothing is compiled
// here: Kargo's programs need its nested `api` module, which the Go module proxy refuses.
// Only require and replace lines: the source comes from the Go module proxy.
module gitops-loop.local/real/kargo

go 1.26

require github.com/akuity/kargo v1.11.2
