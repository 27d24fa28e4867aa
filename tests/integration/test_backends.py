"""Backends against each other on real clips: TorchScript and ``.pt`` (torch) vs ONNX Runtime.

The torch models are exported here from the shared Ultralytics ``.pt`` with ``framebatch
export`` (the optional Ultralytics extra), so the export round trip is tested too. Frames are a
spread sample of each clip (every clip's first frame, then evenly spaced), run in batches of up
to 8 on the torch side and one at a time on the ONNX Runtime side.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from detectors.backends import load_backend, takes_any_size
from detectors.base import BackendOptions, BackendUnavailable
from detectors.detector import Detector
from detectors.postprocess import ImageDetections, Thresholds
from pipeline.errors import EXIT_TARGETS_MISSED
from tests.conftest import ASSETS, MODEL, MODEL_ANY_SIZE, VIDEOS
from tests.integration.matching import unmatched

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHECKPOINT = ASSETS / "models" / "yolov8n-coco.pt"
CLIPS = (
    "street_night_1920x1080_3fps.mp4",
    "highway_traffic_960x540_30fps.mp4",
    "highway_traffic_1920x1080_30fps_20frames.mp4",
    "indoor_person_768x432_10fps.mp4",
)
FRAMES_PER_CLIP = 24


def sample_frames(clip: str, count: int = FRAMES_PER_CLIP) -> list[np.ndarray]:
    with av.open(str(VIDEOS / clip)) as container:
        total = container.streams.video[0].frames or count
        step = max(1, total // count)
        frames = [
            f.to_ndarray(format="bgr24")
            for i, f in enumerate(container.decode(video=0))
            if i % step == 0
        ]
    return frames[:count]


@pytest.fixture(scope="module")
def clip_frames(assets) -> dict[str, list[np.ndarray]]:
    return {clip: sample_frames(clip) for clip in CLIPS}


@pytest.fixture(scope="module")
def onnx_results(clip_frames) -> dict[str, list[ImageDetections]]:
    detector = Detector(load_backend(MODEL, threads=2), thresholds=Thresholds())
    results = {
        clip: [detector.detect_frames([frame])[0] for frame in frames]
        for clip, frames in clip_frames.items()
    }
    detector.close()
    return results


@pytest.fixture(scope="module")
def exported(assets, tmp_path_factory) -> dict[str, Path]:
    """The shared ``.pt`` exported to TorchScript and ONNX (needs the Ultralytics extra)."""
    pytest.importorskip("ultralytics", reason="the Ultralytics extra is not installed")
    os.environ.setdefault("YOLO_CONFIG_DIR", str(tmp_path_factory.mktemp("yolo-config")))
    from detectors.export import ExportRequest, export

    folder = tmp_path_factory.mktemp("exported")
    return {
        fmt: export(ExportRequest(CHECKPOINT, fmt, output=folder / f"yolov8n.{fmt}"))
        for fmt in ("torchscript", "onnx")
    }


def device_bound_ops(path: Path) -> list[str]:
    """Operations of a traced file that make or move a tensor to a device fixed when it was
    traced, other than a grid made on it and moved at once to the input's (``type_as``): on
    another device they meet tensors there and fail."""
    import torch

    bound = []
    for node in torch.jit.load(str(path)).inlined_graph.nodes():
        fixed = [
            i
            for i in node.inputs()
            if i.type().kind() == "DeviceObjType" and i.node().kind() == "prim::Constant"
        ]
        if not fixed:
            continue
        uses = [use.user.kind() for out in node.outputs() for use in out.uses()]
        if node.kind() != "aten::arange" or set(uses) - {"aten::type_as"}:
            bound.append(f"{node.kind()} used by {uses}")
    return bound


def simulated_ultralytics_83_make_anchors(feats, strides, grid_cell_offset=0.5):
    """Ultralytics 8.3's anchor grid: made with ``device=`` the feature maps', which a trace
    freezes (8.4 moves a CPU grid with ``type_as`` instead)."""
    import torch

    points, rows = [], []
    for level, feat in enumerate(feats):
        _, _, height, width = feat.shape
        xs = torch.arange(end=width, device=feat.device, dtype=feat.dtype) + grid_cell_offset
        ys = torch.arange(end=height, device=feat.device, dtype=feat.dtype) + grid_cell_offset
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), -1).view(-1, 2))
        rows.append(
            torch.full((height * width, 1), strides[level], dtype=feat.dtype, device=feat.device)
        )
    return torch.cat(points), torch.cat(rows)


def test_a_torchscript_traced_on_the_cpu_runs_on_other_devices(exported, tmp_path, monkeypatch):
    """``framebatch export --format torchscript`` traces on the CPU (the lent GPU machine has no
    Ultralytics): nothing in the file may stay bound to the CPU, whichever Ultralytics made it."""
    from ultralytics.nn.modules import head

    from detectors.export import ExportRequest, export

    assert not device_bound_ops(exported["torchscript"])
    monkeypatch.setattr(head, "make_anchors", simulated_ultralytics_83_make_anchors)
    older = export(ExportRequest(CHECKPOINT, "torchscript", output=tmp_path / "older.torchscript"))
    assert not device_bound_ops(older)


def run_batched(detector: Detector, frames: list[np.ndarray], batch: int = 8) -> list:
    results = []
    for start in range(0, len(frames), batch):
        results += detector.detect_frames(frames[start : start + batch])
    return results


def labeled(found: ImageDetections) -> list:
    return [
        (tuple(map(float, b)), int(c)) for b, c in zip(found.boxes, found.class_ids, strict=True)
    ]


def assert_parity(expected: dict, actual: dict, clips: tuple[str, ...] = CLIPS) -> None:
    problems = []
    for clip in clips:
        for index, (want, got) in enumerate(zip(expected[clip], actual[clip], strict=True)):
            problems += [f"{clip} #{index}: {p}" for p in unmatched(labeled(want), labeled(got))]
    assert not problems, "\n".join(problems[:20])
    assert sum(len(r) for clip in clips for r in expected[clip]) > 50  # real scenes, real boxes


@pytest.mark.parametrize("nms", ["device", "host"])
def test_torchscript_matches_onnxruntime_on_the_four_clips(
    exported, clip_frames, onnx_results, nms
):
    backend = load_backend(exported["torchscript"], threads=2, nms=nms, max_batch=8)
    assert backend.info.class_names[0] == "person"  # names read from the file's metadata
    detector = Detector(backend, thresholds=Thresholds())
    torch_results = {clip: run_batched(detector, frames) for clip, frames in clip_frames.items()}
    assert_parity(onnx_results, torch_results)


def test_exported_onnx_matches_the_shared_onnx(exported, clip_frames, onnx_results):
    backend = load_backend(exported["onnx"], threads=2)
    assert backend.info.max_batch is None  # dynamic batch axis
    assert backend.info.class_names[:3] == ("person", "bicycle", "car")
    detector = Detector(backend, thresholds=Thresholds())
    assert_parity(onnx_results, {c: run_batched(detector, f) for c, f in clip_frames.items()})


def test_checkpoint_backend_matches_onnxruntime(assets, clip_frames, onnx_results):
    pytest.importorskip("ultralytics", reason="the Ultralytics extra is not installed")
    detector = Detector(load_backend(CHECKPOINT, threads=2, max_batch=8), thresholds=Thresholds())
    street = CLIPS[:1]  # the busiest clip; the others run through the TorchScript test
    assert_parity(onnx_results, {c: run_batched(detector, clip_frames[c]) for c in street}, street)


def test_torch_results_do_not_depend_on_the_batch(exported, clip_frames):
    detector = Detector(
        load_backend(exported["torchscript"], threads=2, max_batch=8), thresholds=Thresholds()
    )
    frames = clip_frames[CLIPS[0]][:8]
    alone = [detector.detect_frames([frame])[0] for frame in frames]
    together = detector.detect_frames(frames)
    for one, batched in zip(alone, together, strict=True):
        assert not unmatched(labeled(one), labeled(batched), min_iou=0.999)


def test_a_second_instance_runs_batches_the_first_prepared(exported, clip_frames):
    """The pipeline's reader prepares every batch on the first instance and whichever inference
    thread is free runs it: each slot must go back to the instance that staged it, or the first
    one's pool runs dry after a few batches and the reader waits for ever."""
    import threading

    path = exported["torchscript"]
    detector = Detector(
        load_backend(path, threads=1, max_batch=2),
        thresholds=Thresholds(),
        instances=[load_backend(path, threads=1, max_batch=2)],
    )
    frames = clip_frames[CLIPS[1]][:2]
    letterbox = detector.letterbox()
    boxed = [letterbox(frame) for frame in frames]
    geometries = [b.geometry for b in boxed]
    reference = detector.postprocess(
        detector.infer(detector.prepare([b.pixels for b in boxed])), geometries
    )
    results: list = []

    def run_on_the_second() -> None:
        for _ in range(8):  # more batches than an instance has slots
            prepared = detector.prepare([b.pixels for b in boxed])
            results.append(detector.postprocess(detector.infer(prepared, instance=1), geometries))

    runner = threading.Thread(target=run_on_the_second, daemon=True)
    runner.start()
    runner.join(timeout=120)  # a hang never ends; the 8 batches take about a second
    assert not runner.is_alive(), f"stuck after {len(results)} batches: a slot went astray"
    for found in results:
        for mine, theirs in zip(reference, found, strict=True):
            assert not unmatched(labeled(mine), labeled(theirs), min_iou=0.999)


@pytest.mark.parametrize("nms", ["device", "host"])
def test_checkpoint_runs_rectangular_batches_like_onnxruntime(assets, clip_frames, nms):
    """``.pt`` on the device path takes 640x384 batches of 16:9 frames (part of a slot sized
    for 640x640) and finds what ONNX Runtime's dynamic model finds on the same rectangles;
    a batch of 4 equals its frames run alone."""
    pytest.importorskip("ultralytics", reason="the Ultralytics extra is not installed")
    backend = load_backend(CHECKPOINT, threads=2, max_batch=8, nms=nms)
    assert backend.info.any_size and takes_any_size(CHECKPOINT)
    checkpoint = Detector(backend, thresholds=Thresholds())
    onnx = Detector(load_backend(MODEL_ANY_SIZE, threads=2), thresholds=Thresholds())
    for clip in CLIPS[:2]:  # 1920x1080 and 960x540: both 640x384
        frames = clip_frames[clip][:8]
        expected = [onnx.detect_frames([frame], rect=True)[0] for frame in frames]
        batched = []
        for start in range(0, len(frames), 4):
            batched += checkpoint.detect_frames(frames[start : start + 4], rect=True)
        alone = [checkpoint.detect_frames([frame], rect=True)[0] for frame in frames[:2]]
        problems = [
            f"{clip} #{index}: {problem}"
            for index, (want, got) in enumerate(zip(expected, batched, strict=True))
            for problem in unmatched(labeled(want), labeled(got))
        ]
        problems += [
            f"{clip} #{index} alone: {problem}"
            for index, (one, many) in enumerate(zip(alone, batched[:2], strict=True))
            for problem in unmatched(labeled(one), labeled(many), min_iou=0.999)
        ]
        assert not problems, "\n".join(problems[:20])
    assert sum(len(r.boxes) for r in expected) > 5


def test_missing_torch_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    for module in ("torchscript", "backend", "runner", "nms"):  # imported again, without torch
        monkeypatch.delitem(sys.modules, f"detectors.device.{module}", raising=False)
    model = tmp_path / "m.torchscript"
    model.write_bytes(b"PK\x03\x04" + bytes(60))  # a zip archive, as TorchScript files are
    with pytest.raises(BackendUnavailable, match=r"framebatch\[torch\]"):
        load_backend(model)


def test_missing_tensorrt_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"\0" * 64)
    with pytest.raises(BackendUnavailable, match="tensorrt"):
        load_backend(engine)


def test_cuda_asked_for_without_cuda_is_a_clear_error(exported):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(BackendUnavailable, match="no CUDA device.*use device: cpu"):
        load_backend(exported["torchscript"], options=BackendOptions(device="cuda:0"))


#: framebatch's core dependencies that the lent GPU machine's image lacks (the device tool's
#: KINDS.md, 2026-11-17) and that deploy/gpu_check.sh does not carry: bench-gpu and tests/gpu
#: must run without them
LENT_MACHINE_LACKS = {
    "fastapi": "fastapi",
    "fastapi-offline": "fastapi_offline",
    "nats-py": "nats",
    "paho-mqtt": "paho",
    "supervision": "supervision",
    "trackers": "trackers",
    "uvicorn": "uvicorn",
}
LENT_IMAGE_HAS = {"numpy", "opencv-python-headless", "onnxruntime", "prometheus-client", "pyyaml"}

LENT_MACHINE_IMPORTS = """
import importlib.abc, sys

class LentMachine(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {lacking!r}:
            raise ModuleNotFoundError(f"the lent GPU machine has no {{name}}", name=name)

sys.meta_path.insert(0, LentMachine())
"""


def test_the_lent_machine_model_names_every_dependency_it_lacks():
    import re
    import tomllib

    from tests.conftest import REPO_ROOT

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[\[<>=!~ ;]", dep, maxsplit=1)[0] for dep in project["dependencies"]}
    script = (REPO_ROOT / "deploy" / "gpu_check.sh").read_text()
    carried = set(re.search(r'^wheels="([^"]+)"', script, re.M).group(1).split())
    assert core - carried - LENT_IMAGE_HAS == set(LENT_MACHINE_LACKS)


def test_gpu_bench_script_runs_on_the_cpu(exported, tmp_path):
    """The prepared GPU bench, run here with ``--device cpu`` so it is known to work before a
    GPU is lent, in a Python that cannot import what the lent machine lacks: every figure is
    measured and the replay processes every frame."""
    import subprocess

    from tests.conftest import REPO_ROOT

    site = tmp_path / "lent-machine"
    site.mkdir()
    lacking = sorted(LENT_MACHINE_LACKS.values())
    (site / "sitecustomize.py").write_text(LENT_MACHINE_IMPORTS.format(lacking=lacking))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT)])}
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "pipeline.cli", "bench-gpu",
        f"--model={exported['torchscript']}", f"--clip={VIDEOS / CLIPS[0]}", "--device=cpu",
        "--batch-sizes=1,2", "--seconds=0.3", "--rounds=1", "--cameras=1", f"--out={out}",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert "the lent GPU machine has no" not in done.stderr, done.stderr[-3000:]
    result = json.loads((out / "bench-gpu.json").read_text())
    targets = result["targets"]
    assert set(targets) == {"batching_vs_batch1", "double_vs_single", "pipeline_vs_raw"}
    assert all(target["measured"] > 0 for target in targets.values())
    # a missed target is a non-zero exit, so the GPU check fails loudly (on a CPU the targets
    # are usually missed, but 0.3 s figures on a busy machine can pass one by chance)
    missed = any(not target["pass"] for target in targets.values())
    assert done.returncode == (EXIT_TARGETS_MISSED if missed else 0), done.stderr[-3000:]
    assert set(result["throughput"]) == {"fp32-b1", "fp32-b2"}  # no FP16 on the CPU
    assert all(ips > 0 for ips in [*result["throughput"].values(), *result["compared"].values()])
    assert result["pipeline"]["frames"] == 8 and result["pipeline"]["dropped"] == {}
    assert "| double_vs_single |" in (out / "bench-gpu.md").read_text()
