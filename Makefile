# Every target is one line calling cargo xtask; the logic lives there.
.PHONY: test tools bench-render
test:
	cargo xtask test
tools:
	cargo xtask tools
bench-render:
	cargo xtask bench render
