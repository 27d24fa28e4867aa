# The two entry points (see README): `make demo` and `make test`. Each sets up what it needs.
.PHONY: setup setup-tests demo test lint bench

setup:
	bash deploy/bootstrap.sh

setup-tests:
	bash deploy/bootstrap.sh --tests

# clips and model: linked from ../shared/assets, else downloaded and checked by sha256 (the
# model's .pt is then exported to ONNX, which needs the optional Ultralytics extra)
demo: setup
	.venv/bin/python -m samples.clips fetch --no-download || .venv/bin/python -m samples.clips fetch
	.venv/bin/framebatch models fetch yolov8n --no-download || \
	  { bash deploy/bootstrap.sh --export && .venv/bin/framebatch models fetch yolov8n; }
	.venv/bin/python -m samples.demo

test: setup-tests
	.venv/bin/ruff check pipeline streams detectors framebatch_tools samples tests
	YOLO_CONFIG_DIR=$(CURDIR)/.venv/yolo-config YOLO_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15

bench: setup
	.venv/bin/framebatch bench --rounds 3 --output docs/bench-latest.json
