# The two entry points (see README): `make demo` and `make test`. Each sets up what it needs.
.PHONY: setup setup-tests demo test lint bench

setup:
	bash deploy/bootstrap.sh

setup-tests:
	bash deploy/bootstrap.sh --tests

# clips and model: linked from the assets folder ($$FRAMEBATCH_ASSETS, else ../shared/assets),
# else downloaded and checked by sha256; each fetch fails at once, in a few lines, when it can
# neither link nor download. A downloaded .pt is exported to ONNX, which needs the optional
# Ultralytics extra: installed only then, after the download worked.
demo: setup
	.venv/bin/python -m samples.clips fetch
	.venv/bin/framebatch models fetch yolov8n --no-export
	.venv/bin/framebatch models fetch yolov8n --no-download >/dev/null 2>&1 || \
	  { bash deploy/bootstrap.sh --export && .venv/bin/framebatch models fetch yolov8n --no-download; }
	.venv/bin/python -m samples.demo

test: setup-tests
	.venv/bin/ruff check pipeline streams detectors framebatch_tools samples tests
	YOLO_CONFIG_DIR=$(CURDIR)/.venv/yolo-config YOLO_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15

bench: setup
	.venv/bin/framebatch bench --rounds 3 --output docs/bench-latest.json
