"""CPU backends side by side, the detector alone: ``python -m framebatch_tools.bench.backends
[--backends onnxruntime,openvino] [--batches 1,2,4,8] [--rounds 3]``.

The same model (the Ultralytics ONNX export of any input size, so both run 640x384 rectangular
batches of the 540p highway clip's frames), the same letterboxed frames, one instance with
``--threads`` threads each; prepare + infer + postprocess timed per batch, backends and batch
sizes interleaved in each round (this machine is shared: compare within one run). Prints
images/s per backend and batch size, the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import av
import numpy as np

from detectors.backends import load_backend
from detectors.detector import Detector
from detectors.postprocess import Thresholds

SHARED = Path(__file__).resolve().parents[3] / "shared" / "assets"
MODEL = SHARED / "models" / "yolov8n-coco_ultralytics_dynamic.onnx"
CLIP = SHARED / "videos" / "highway_traffic_960x540_30fps.mp4"


def frames(count: int) -> list[np.ndarray]:
    with av.open(str(CLIP)) as container:
        decoded = container.decode(video=0)
        return [next(decoded).to_ndarray(format="bgr24") for _ in range(count)]


def images_per_s(detector: Detector, shots: list[np.ndarray], batch: int, seconds: float) -> float:
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        detector.detect_frames(shots[:batch], rect=True)
        done += batch
    return done / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="onnxruntime,openvino", metavar="NAMES")
    parser.add_argument("--batches", default="1,2,4,8", metavar="N,N", help="batch sizes")
    parser.add_argument("--rounds", type=int, default=3, metavar="N")
    parser.add_argument("--seconds", type=float, default=4.0, metavar="S", help="per measure")
    parser.add_argument("--threads", type=int, default=2, metavar="N", help="per instance")
    parser.add_argument("--model", type=Path, default=MODEL, metavar="PATH")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    shots = frames(max(batches))
    detectors = {
        name: Detector(
            load_backend(args.model, name, threads=args.threads), thresholds=Thresholds()
        )
        for name in args.backends.split(",")
    }
    for detector in detectors.values():  # compiled and warm at every size before timing
        for batch in batches:
            detector.detect_frames(shots[:batch], rect=True)
    rounds: dict[str, dict[int, list[float]]] = {n: {b: [] for b in batches} for n in detectors}
    for index in range(args.rounds):
        order = list(detectors) if index % 2 == 0 else list(reversed(detectors))
        for batch in batches:
            for name in order:
                rounds[name][batch].append(
                    images_per_s(detectors[name], shots, batch, args.seconds)
                )
    result = {
        name: {batch: round(statistics.median(values), 2) for batch, values in sizes.items()}
        for name, sizes in rounds.items()
    }
    print("batch  " + "  ".join(f"{name:>12}" for name in result))
    for batch in batches:
        print(f"{batch:>5}  " + "  ".join(f"{result[name][batch]:>12.2f}" for name in result))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "median": result}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
