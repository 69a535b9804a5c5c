# Every target is one line calling cargo xtask; the logic lives there.
.PHONY: demo test tools ground-up kind-up kind-down bench-render bench-check
demo:
	cargo xtask demo
test:
	cargo xtask test
tools:
	cargo xtask tools
bench-render:
	cargo xtask bench render
ground-up:
	cargo xtask ground up
bench-check:
	cargo xtask bench check
kind-up:
	cargo xtask kind up
kind-down:
	cargo xtask kind down
