"""Backends as plug-ins: every module of ``detectors/backends`` is a backend, and one new module
is all a new backend takes (its suffix, file check and missing-library message included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import detectors.backends as backends
from detectors.base import BackendUnavailable, BatchOutput, ModelInfo
from pipeline.config import MODEL_SUFFIXES, ModelConfig

FAKE_PLUGIN = """
from detectors.backends import BackendPlugin
import numpy as np
from detectors.base import BatchOutput, ModelInfo

PLUGIN = BackendPlugin(suffixes=(".fake",), extra="torch", magic=b"FAKE", file_kind="a fake model")


class FakeModelBackend:
    name = "fakemodel"

    def __init__(self, path, options):
        self.info = ModelInfo(str(path), self.name, 64, 64, ("thing",))

    def prepare(self, images):
        return np.stack(images)

    def infer(self, batch):
        return BatchOutput(raw=np.zeros((len(batch), 5, 1), np.float32))

    def warmup(self, sizes):
        pass

    def close(self):
        pass


def open_backend(path, options):
    if path.stem == "needs-a-library":
        import a_library_nobody_installed  # noqa: F401
    return FakeModelBackend(path, options)
"""


@pytest.fixture
def with_fake_plugin(tmp_path, monkeypatch):
    """A backend module dropped beside the project's own."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "fakemodel.py").write_text(FAKE_PLUGIN)
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(folder)])
    backends.backend_modules.cache_clear()
    yield folder
    backends.backend_modules.cache_clear()


def test_the_project_backends_and_what_is_derived_from_them():
    assert backends.backend_names() == (
        "onnxruntime",
        "openvino",
        "tensorrt",
        "torchscript",
        "ultralytics",
    )
    assert backends.suffixes()[".xml"] == "openvino" and backends.plugin("openvino").rect
    assert MODEL_SUFFIXES == backends.suffixes()
    assert backends.suffixes()[".pt"] == "ultralytics"
    assert backends.plugin("onnxruntime").rect and backends.plugin("onnxruntime").cpu_instances
    assert not backends.plugin("torchscript").cpu_instances
    assert set(ModelConfig.model_fields["backend"].annotation.__args__) == {
        "auto",
        *backends.backend_names(),
    }


def test_one_new_module_is_a_new_backend(with_fake_plugin, tmp_path):
    assert "fakemodel" in backends.backend_names()
    model = tmp_path / "m.fake"
    model.write_bytes(b"FAKE-weights")
    backend = backends.load_backend(model)  # picked by its suffix
    assert backend.info.backend == "fakemodel"
    output = backend.infer(backend.prepare([np.zeros((64, 64, 3), np.uint8)] * 3))
    assert isinstance(output, BatchOutput) and len(output) == 3
    wrong = tmp_path / "w.fake"
    wrong.write_bytes(b"JUNK")
    with pytest.raises(ValueError, match="is not a fake model: its first bytes are b'JUNK'"):
        backends.load_backend(wrong)
    missing = tmp_path / "needs-a-library.fake"
    missing.write_bytes(b"FAKE")
    with pytest.raises(BackendUnavailable, match=r"fakemodel backend needs 'a_library_nobody"):
        backends.load_backend(missing)


def test_a_module_that_is_not_a_backend_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "halfdone.py").write_text("PLUGIN = None\n")
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(folder)])
    backends.backend_modules.cache_clear()
    try:
        with pytest.raises(TypeError, match="halfdone must define PLUGIN and open_backend"):
            backends.backend_names()
    finally:
        backends.backend_modules.cache_clear()


def test_a_batch_output_holds_one_kind_of_result():
    with pytest.raises(ValueError, match="either the raw head or the kept boxes"):
        BatchOutput()
    assert len(BatchOutput(raw=np.zeros((2, 84, 10), np.float32))) == 2
    assert ModelInfo("m", "b", 1, 1, ()).label(3) == "3"


def test_every_backend_module_has_its_docstring():
    for name, module in backends.backend_modules().items():
        assert module.__doc__, name
        assert Path(module.__file__).stem == name
