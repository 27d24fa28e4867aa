# The two entry points (see README): `make demo` and `make test`. Each sets up what it needs.
.PHONY: setup setup-tests demo test lint bench

setup:
	bash deploy/bootstrap.sh

setup-tests:
	bash deploy/bootstrap.sh --tests

demo: setup
	.venv/bin/python -m samples.clips fetch --no-download || .venv/bin/python -m samples.clips fetch
	.venv/bin/python -m samples.demo

test: setup-tests
	.venv/bin/ruff check pipeline streams detectors samples tests
	YOLO_CONFIG_DIR=$(CURDIR)/.venv/yolo-config YOLO_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15

bench: setup
	.venv/bin/framebatch bench --rounds 3 --output docs/bench-latest.json
