"""Which GPU NVML reports for each ``cuda:N`` the workers run on (a fake NVML: the mapping is
pure logic; the real library has never run on a GPU here)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline.serve.metrics import NvmlGpus


@dataclass(frozen=True)
class FakeGpu:
    index: int  # NVML's: PCI bus order over the whole machine
    uuid: str


@dataclass(frozen=True)
class FakeRates:
    gpu: int


@dataclass(frozen=True)
class FakeMemory:
    used: int
    total: int


class FakeNvml:
    """Four GPUs; utilisation is 10 × the NVML index, so a figure names the GPU it came from."""

    def __init__(self, gpus: int = 4):
        self.gpus = [FakeGpu(i, f"GPU-{i:08x}-aaaa") for i in range(gpus)]

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> FakeRates:
        return FakeRates(10 * gpu.index)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> FakeMemory:
        return FakeMemory(used=gpu.index, total=80)


def utilization(gpus: NvmlGpus) -> dict[str, float]:
    families = {family.name: family for family in gpus.collect()}
    return {s.labels["gpu"]: s.value for s in families["framebatch_gpu_utilization_ratio"].samples}


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, {"0": 0.0, "1": 0.1}),  # every GPU visible: the same numbers
        ("2,3", {"0": 0.2, "1": 0.3}),  # cuda:0 is the machine's third GPU
        ("GPU-00000003-aaaa,GPU-00000001-aaaa", {"0": 0.3, "1": 0.1}),  # Kubernetes: UUIDs
    ],
)
def test_each_cuda_device_is_the_gpu_cuda_visible_devices_names(visible, expected):
    assert utilization(NvmlGpus([0, 1], nvml=FakeNvml(), visible=visible)) == expected


def test_a_device_nvml_cannot_find_loses_only_itself(caplog):
    gpus = NvmlGpus([0, 1, 2], nvml=FakeNvml(), visible="1,0,7")  # no GPU 7 on this machine
    assert utilization(gpus) == {"0": 0.1, "1": 0.0}
    assert "cuda:2" in caplog.text


def test_a_device_listed_twice_is_reported_once():
    assert utilization(NvmlGpus([0, 0], nvml=FakeNvml())) == {"0": 0.0}
