#!/usr/bin/env bash
# The GPU check of issue #4 as one prepared call, for a machine lent by the workplace's device
# tool (an H200 with PyTorch, no internet, no Redis, no TensorRT).
#
#   bash deploy/gpu_check.sh prepare   # here: wheels, redis-server .debs, a TorchScript export
#   bash deploy/gpu_check.sh run       # there, with carry [".gpu"]; results under $OUT
#
# `run` unpacks what `prepare` made, runs the CUDA tests (tests/gpu), then `framebatch
# bench-gpu` with the whole pipeline on N replayed cameras, and writes JSON + markdown to $OUT.
# It exits non-zero when CUDA is missing, a test fails or a figure misses its target.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=.gpu
clip=../shared/assets/videos/highway_traffic_960x540_30fps.mp4  # 335 frames per camera
# what framebatch needs and the lent image lacks (device tool's KINDS.md, 2026-11-17): it has
# numpy, onnxruntime, opencv, pyyaml, prometheus-client and torch. The HTTP stack, the outputs
# and analytics are not carried: bench-gpu and tests/gpu never import them
# (tests/integration/test_backends.py runs bench-gpu without them).
wheels="av redis hiredis pydantic pydantic-core annotated-types typing-inspection"
carry_limit_mib=60 # the device tool sends at most 64 MiB: the checkout is ~4 MiB
# device time: 15 minutes a session, start-up included; the run below stays under 5 minutes
# (tests 120 s, bench 180 s) so that a fix and a second run still fit
tests_timeout_s=120
bench_timeout_s=180

case "${1:-}" in
prepare)
  grep -qx "/$stage/" .git/info/exclude 2>/dev/null || echo "/$stage/" >>.git/info/exclude
  rm -rf "$stage" && mkdir -p "$stage/whl" "$stage/deb" "$stage/assets"
  # what the lent image lacks (it has numpy, onnxruntime, opencv, pyyaml, torch, pytest)
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$stage/whl" $wheels
  (cd "$stage/deb" && apt-get download redis-server redis-tools liblzf1 libjemalloc2 >/dev/null)
  YOLO_CONFIG_DIR=.venv/yolo-config .venv/bin/framebatch export \
    ../shared/assets/models/yolov8n-coco.pt --format torchscript --output "$stage/yolov8n.torchscript"
  # the clips the tests and the bench read (all that travels must stay under 64 MiB)
  cp ../shared/assets/videos/street_night_1920x1080_3fps.mp4 "$clip" "$stage/assets/"
  size_mib=$(($(du -sb "$stage" | cut -f1) / 1048576))
  echo "$stage: $size_mib MiB to carry (limit $carry_limit_mib)"
  [ "$size_mib" -le "$carry_limit_mib" ] || { echo "too large to carry" >&2; exit 1; }
  ;;
run)
  : "${OUT:?run this on the device machine, where OUT is set}"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$stage"/whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
  for deb in "$stage"/deb/*.deb; do dpkg -x "$deb" /tmp/redis; done
  export PATH="/tmp/redis/usr/bin:$PATH"
  # redis-server's own libraries (liblzf, jemalloc) were unpacked beside it, not installed
  export LD_LIBRARY_PATH="/tmp/redis/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  redis-server --version | tee "$OUT/redis.txt" # fails here, said first, not as a skipped figure
  export FRAMEBATCH_TORCHSCRIPT="$PWD/$stage/yolov8n.torchscript"
  mkdir -p ../shared/assets/videos && cp -n "$stage"/assets/*.mp4 ../shared/assets/videos/
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
  # no CUDA would skip every GPU test and pass: that is a failed check, said first
  python3 -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'"
  # both steps always run and write their results; the exit status says if either failed
  # (a test failure, or a figure under its target: bench-gpu exits 4)
  set +e
  timeout "$tests_timeout_s" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -rs 2>&1 |
    tee "$OUT/tests-gpu.txt"
  tests_rc=${PIPESTATUS[0]}
  # bench-gpu writes its JSON after each step: a late failure keeps the figures before it
  timeout "$bench_timeout_s" python3 -m pipeline.cli bench-gpu --model "$FRAMEBATCH_TORCHSCRIPT" \
    --clip "$stage/assets/$(basename "$clip")" --device cuda:0 --batch-sizes 1,8,32 \
    --seconds 1.0 --rounds 2 --cameras 8 --out "$OUT" 2>&1 | tail -40
  bench_rc=${PIPESTATUS[0]}
  set -e
  echo "gpu tests exit $tests_rc, bench-gpu exit $bench_rc" | tee "$OUT/status.txt"
  [ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
  ;;
*)
  echo "usage: $0 prepare|run" >&2
  exit 2
  ;;
esac
