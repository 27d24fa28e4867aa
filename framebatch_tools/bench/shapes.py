"""``framebatch bench --mixed-shapes``: a batch of two aspects, run per shape or padded to one.

With rectangular letterboxing a 16:9 camera's frames are 640×384 and a 4:3 camera's 640×480. A
dispatched batch holding both can run as one inference per shape (what framebatch does) or be
padded to the smallest common shape (the 384-row frames get 48 more rows of letterbox grey on
each side) and run as one. This measures both on real frames, in alternating rounds (medians),
and how far the padded frames' detections are from their own-shape ones: padding reaches the
convolutions, so a frame's boxes would depend on its batch-mates.

The 4:3 camera is the first clip of the config, centre-cropped to 4:3 (the shared clips are all
16:9): the same scenes, another aspect.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from detectors.accuracy import compare_detections
from detectors.detector import Detector
from detectors.postprocess import ImageDetections
from detectors.preprocess import PAD_VALUE, Letterbox, Letterboxed, LetterboxGeometry
from framebatch_tools.bench.pipeline import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, machine_info
from pipeline.config import ConfigError, load_config
from pipeline.supervisor.builders import frame_letterbox, load_detector
from streams.sources import SourceError, VideoSource

FRAMES_PER_ASPECT = 32


def crop_4_3(image: np.ndarray) -> np.ndarray:
    """The centre 4:3 part of a wider frame."""
    height, width = image.shape[:2]
    crop = min(width, height * 4 // 3)
    left = (width - crop) // 2
    return np.ascontiguousarray(image[:, left : left + crop])


def pad_to(boxed: Letterboxed, height: int, width: int) -> Letterboxed:
    """More letterbox grey around a letterboxed frame, centred as the letterbox centres it (the
    odd row to the bottom/right); its geometry follows."""
    rows, cols = height - boxed.pixels.shape[0], width - boxed.pixels.shape[1]
    top, left = rows // 2, cols // 2
    pixels = np.full((height, width, 3), PAD_VALUE, np.uint8)
    pixels[top : top + boxed.pixels.shape[0], left : left + boxed.pixels.shape[1]] = boxed.pixels
    g = boxed.geometry
    geometry = LetterboxGeometry(g.width, g.height, g.scale, g.pad_x + left, g.pad_y + top)
    return Letterboxed(pixels, geometry)


def two_aspects(url: str, letterbox: Letterbox, count: int) -> tuple[list, list]:
    """``count`` frames of the clip letterboxed as they are (16:9) and centre-cropped to 4:3."""
    wide, narrow = [], []
    with VideoSource("mixed-shapes", url) as source:
        for decoded in source.frames():
            wide.append(letterbox(decoded.image))
            narrow.append(letterbox(crop_4_3(decoded.image)))
            if len(wide) == count:
                break
    if len(wide) < count:
        raise SourceError(f"{url}: {len(wide)} frames, the bench needs {count}")
    return wide, narrow


def detect(detector: Detector, batch: list[Letterboxed]) -> list[ImageDetections]:
    return detector.detect([b.pixels for b in batch], [b.geometry for b in batch])


def time_once(detector: Detector, wide: list, narrow: list, padded: bool) -> float:
    """Seconds for one mixed batch (``len(wide) + len(narrow)`` frames), detections included."""
    started = time.perf_counter()
    if padded:
        detect(detector, wide + narrow)
    else:
        detect(detector, wide)
        detect(detector, narrow)
    return time.perf_counter() - started


def measure(detector: Detector, wide: list, narrow: list, sizes: list[int], rounds: int) -> dict:
    height, width = narrow[0].pixels.shape[:2]
    wide_padded = [pad_to(boxed, height, width) for boxed in wide]
    results: dict[str, Any] = {
        "shapes": [list(wide[0].pixels.shape[:2]), [height, width]],
        "padded_shape": [height, width],
        "sizes": {},
    }
    for size in sizes:  # per aspect: a batch holds ``size`` frames of each
        batches = [
            (wide[i : i + size], narrow[i : i + size]) for i in range(0, len(wide) - size + 1, size)
        ]
        per_shape, padded = [], []
        time_once(detector, *batches[0], padded=False)  # warm-up of each shape
        time_once(detector, [pad_to(b, height, width) for b in batches[0][0]], batches[0][1], True)
        for _ in range(rounds):
            for w, n in batches:
                per_shape.append(time_once(detector, w, n, padded=False))
                w_padded = [pad_to(b, height, width) for b in w]
                padded.append(time_once(detector, w_padded, n, padded=True))
        frames = 2 * size
        results["sizes"][str(size)] = {
            "per_shape_fps": frames / statistics.median(per_shape),
            "padded_fps": frames / statistics.median(padded),
            "padded_over_per_shape": statistics.median(per_shape) / statistics.median(padded),
            "batches": len(per_shape),
        }
    own = detect(detector, wide)
    report = compare_detections(
        own, detect(detector, wide_padded), iou_threshold=0.99, names=("own shape", "padded")
    )
    results["parity"] = {
        "frames": report.images,
        "own_shape_boxes": report.reference_boxes,
        "padded_boxes": report.candidate_boxes,
        "matched_iou_0_99": report.matched,
        "match_rate": report.match_rate,
        "max_score_drop": report.max_score_drop,
    }
    return results


def format_report(data: dict[str, Any]) -> str:
    (wh, ww), (nh, nw) = data["shapes"]
    lines = [
        f"mixed batch: 16:9 frames {ww}x{wh} with 4:3 frames {nw}x{nh}; padded: all {nw}x{nh}",
        "",
        "| frames a batch (each aspect) | per shape (frames/s) | padded (frames/s) "
        "| padded ÷ per shape |",
        "|---:|---:|---:|---:|",
    ]
    for size, row in data["sizes"].items():
        lines.append(
            f"| {2 * int(size)} ({size}) | {row['per_shape_fps']:.2f} | {row['padded_fps']:.2f} "
            f"| {row['padded_over_per_shape']:.2f}× |"
        )
    parity = data["parity"]
    lines += [
        "",
        f"16:9 frames padded to {nw}x{nh} vs their own shape ({parity['frames']} frames): "
        f"{parity['matched_iou_0_99']} of {parity['own_shape_boxes']} boxes matched "
        f"(IoU ≥ 0.99, same class) = {parity['match_rate']:.1%}; padded found "
        f"{parity['padded_boxes']}; largest score drop {parity['max_score_drop']:+.3f}",
    ]
    return "\n".join(lines)


def run_bench_shapes(args: argparse.Namespace) -> int:
    try:
        sizes = sorted({int(size) for size in args.batch_sizes.split(",") if size.strip()})
        if not sizes or sizes[0] < 1 or args.rounds < 1:
            raise ValueError("--batch-sizes and --rounds take integers >= 1")
        config = load_config(args.config)
        if not config.cameras:
            raise ValueError(f"{args.config}: no camera to take frames from")
        letterbox = frame_letterbox(config)
        if not letterbox.rect:
            raise ValueError(f"{config.model.path.name}: no rectangular inference (model.rect)")
        detector = load_detector(config)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"framebatch bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        count = max(FRAMES_PER_ASPECT, max(sizes))
        wide, narrow = two_aspects(config.cameras[0].url, letterbox, count)
        data = {
            "command": shlex.join(sys.argv),
            "machine": machine_info(),
            "clip": config.cameras[0].url,
            **measure(detector, wide, narrow, sizes, args.rounds),
        }
    except SourceError as exc:
        print(f"framebatch bench: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        detector.close()
    print(format_report(data))
    if args.output:
        Path(args.output).write_text(json.dumps(data, indent=2))
    return EXIT_OK
