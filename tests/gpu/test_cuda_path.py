"""The device path on CUDA: pinned slots, two streams, FP16, CUDA graphs, NMS on the GPU.

Skipped without CUDA (CI has none); run on a lent GPU with ``pytest tests/gpu``. The model is
a TorchScript export of the shared ``.pt`` (``FRAMEBATCH_TORCHSCRIPT`` names one made
elsewhere, for machines without the Ultralytics extra).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the framebatch[torch] extra) is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the GPU path cannot run here", allow_module_level=True)

from detectors.backends import load_backend  # noqa: E402
from detectors.base import BackendOptions  # noqa: E402
from detectors.detector import Detector  # noqa: E402
from detectors.postprocess import Thresholds  # noqa: E402
from tests.conftest import ASSETS, VIDEOS  # noqa: E402
from tests.integration.matching import unmatched  # noqa: E402
from tests.integration.test_backends import CLIPS, labeled, sample_frames  # noqa: E402

pytestmark = [pytest.mark.gpu]


@pytest.fixture(scope="module", autouse=True)
def true_fp32():
    """cuDNN's convolutions (and matmuls where allowed) run in TF32, a 10-bit mantissa, by
    default on Ampere and later GPUs: "FP32 on CUDA equals the CPU" holds only with it off."""
    backends = torch.backends
    before = backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32
    backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = False
    yield
    backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32 = before


@pytest.fixture(scope="module")
def torchscript(tmp_path_factory) -> Path:
    if os.environ.get("FRAMEBATCH_TORCHSCRIPT"):
        return Path(os.environ["FRAMEBATCH_TORCHSCRIPT"])
    pytest.importorskip("ultralytics", reason="set FRAMEBATCH_TORCHSCRIPT or install the extra")
    from detectors.export import ExportRequest, export

    target = tmp_path_factory.mktemp("gpu") / "yolov8n.torchscript"
    return export(
        ExportRequest(ASSETS / "models" / "yolov8n-coco.pt", "torchscript", output=target)
    )


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    clips = [VIDEOS / clip for clip in CLIPS[:2]]
    if not all(clip.is_file() for clip in clips):
        pytest.skip(f"shared clips not found under {VIDEOS}")
    return sample_frames(CLIPS[0], 8) + sample_frames(CLIPS[1], 8)


def detect(model: Path, frames, **options) -> list:
    backend = load_backend(model, options=BackendOptions(max_batch=8, **options))
    detector = Detector(backend, thresholds=Thresholds())
    backend.warmup([1, 8])  # two sizes: a graph of one must not replay the other's buffers
    results = detector.detect_frames(frames[:8]) + detector.detect_frames(frames[8:])
    results += [detector.detect_frames([frame])[0] for frame in frames[:2]]
    detector.close()
    return results


@pytest.fixture(scope="module")
def cpu_reference(torchscript, frames) -> list:
    """The same model on the CPU, one frame at a time (it matches ONNX Runtime: see
    tests/integration/test_backends.py), in the order ``detect`` returns."""
    detector = Detector(load_backend(torchscript, threads=4), thresholds=Thresholds())
    alone = [detector.detect_frames([frame])[0] for frame in frames]
    return alone + alone[:2]


def mismatches(expected, actual, min_iou=0.99) -> list[str]:
    problems = []
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        problems += [f"#{index}: {p}" for p in unmatched(labeled(want), labeled(got), min_iou)]
    return problems


def test_fp32_on_cuda_matches_the_cpu(torchscript, frames, cpu_reference):
    assert not mismatches(cpu_reference, detect(torchscript, frames, device="cuda:0"))


@pytest.mark.parametrize(
    "variant",
    [{"double_buffer": False}, {"cuda_graphs": True}, {"nms": "host"}],
    ids=["single-buffer", "cuda-graphs", "host-nms"],
)
def test_every_variant_of_the_path_gives_the_same_boxes(torchscript, frames, variant):
    baseline = detect(torchscript, frames, device="cuda:0")
    assert not mismatches(baseline, detect(torchscript, frames, device="cuda:0", **variant), 0.999)


def test_fp16_keeps_nearly_every_box(torchscript, frames, cpu_reference):
    half = detect(torchscript, frames, device="cuda:0", half=True)
    boxes = sum(len(r) for r in cpu_reference)
    assert len(mismatches(cpu_reference, half, min_iou=0.9)) <= 0.05 * boxes


def test_slots_are_pinned_and_reused(torchscript):
    backend = load_backend(torchscript, options=BackendOptions(device="cuda:0", max_batch=4))
    blank = [np.full((640, 640, 3), 114, np.uint8)] * 4
    seen = set()
    for _ in range(6):
        staged = backend.prepare(blank)
        assert staged.slot.host.is_pinned()
        seen.add(staged.slot.host.data_ptr())
        backend.infer(staged)
    assert len(seen) <= 3  # a fixed pool: no allocation per batch
