# Every target is one line calling cargo xtask; the logic lives there.
.PHONY: demo demo-triage demo-structural demo-migration demo-fix demo-green demo-chain test tools ground-up kind-up kind-down bench-render bench-check bench-observer bench-bosun bench-check-crd-heavy bench-reshape
demo:
	cargo xtask demo
demo-triage:
	cargo xtask demo-triage
demo-structural:
	cargo xtask demo-structural

demo-migration:
	cargo xtask demo-migration

demo-fix:
	cargo xtask demo-fix

demo-green:
	cargo xtask demo-green

demo-chain:
	cargo xtask demo-chain
test:
	cargo xtask test
tools:
	cargo xtask tools
bench-render:
	cargo xtask bench render
bench-check:
	cargo xtask bench check
bench-observer:
	cargo xtask bench observer
bench-bosun:
	cargo xtask bench bosun
bench-check-crd-heavy:
	cargo xtask bench check --chart crd-heavy
bench-reshape:
	cargo xtask bench reshape
ground-up:
	cargo xtask ground up
kind-up:
	cargo xtask kind up
kind-down:
	cargo xtask kind down
