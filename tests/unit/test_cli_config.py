"""``framebatch check-config`` checks what it can without loading the model or opening a camera,
and ``off`` means no HTTP endpoint in the config as on the command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.cli.run import with_http_listen
from pipeline.config import ConfigError, load_config, parse_config

ONNX_HEAD = b"\x08\x07\x12\x07pytorch"  # an ONNX file starts with its ir_version field


def write(path: Path, **config: object) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def files(tmp_path: Path, *names: str, model: bytes = ONNX_HEAD) -> tuple[Path, list[Path]]:
    (tmp_path / "m.onnx").write_bytes(model)
    clips = [tmp_path / name for name in names]
    for clip in clips:
        clip.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    return tmp_path / "m.onnx", clips


def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_says_what_it_checked(tmp_path, capsys):
    model, (a, b) = files(tmp_path, "a.mp4", "b.mp4")
    config = write(
        tmp_path / "c.yaml",
        model={"path": str(model)},
        cameras=[
            {"id": "a", "url": str(a)},
            {"id": "b", "url": "b.mp4"},  # relative to the config's folder
            {"id": "door", "url": "rtsp://10.0.0.1/cam"},
        ],
    )
    code, out, err = check(capsys, str(config))
    assert code == 0, err
    assert out.strip() == (
        f"{config}: ok (3 cameras: 2 files found, 1 live, not contacted; "
        f"model m.onnx: onnxruntime, 0.0 MB, not loaded)"
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"hello, I am text\n", "is not an ONNX model (protobuf)"),
        (b"", "is empty"),
    ],
)
def test_a_model_file_that_is_no_model_is_an_error(tmp_path, capsys, content, expected):
    model, (a,) = files(tmp_path, "a.mp4", model=content)
    config = write(
        tmp_path / "c.yaml", model={"path": str(model)}, cameras=[{"id": "a", "url": str(a)}]
    )
    code, _out, err = check(capsys, str(config))
    assert code == 2
    assert f"model.path: model file {model} {expected}" in err


def test_every_missing_or_unreadable_camera_file_is_listed(tmp_path, capsys):
    model, (a,) = files(tmp_path, "a.mp4")
    (tmp_path / "folder.mp4").mkdir()
    config = write(
        tmp_path / "c.yaml",
        model={"path": str(tmp_path / "gone.onnx")},
        cameras=[
            {"id": "a", "url": str(a)},
            {"id": "b", "url": str(tmp_path / "nope.mp4")},
            {"id": "c", "url": f"file://{tmp_path}/also-nope.mp4"},
            {"id": "d", "url": str(tmp_path / "folder.mp4")},
        ],
    )
    code, out, err = check(capsys, str(config))
    assert code == 2 and out == ""
    assert f"invalid config {config} (4 errors):" in err
    assert f"  - model.path: model file not found: {tmp_path / 'gone.onnx'}" in err
    assert f"  - cameras[1].url: file not found: {tmp_path / 'nope.mp4'}" in err
    assert f"  - cameras[2].url: file not found: {tmp_path / 'also-nope.mp4'}" in err
    assert f"  - cameras[3].url: {tmp_path / 'folder.mp4'} is a folder" in err
    assert "cameras[0]" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_camera_file_is_an_error(tmp_path, capsys):
    model, (a,) = files(tmp_path, "a.mp4")
    a.chmod(0)
    config = write(
        tmp_path / "c.yaml", model={"path": str(model)}, cameras=[{"id": "a", "url": str(a)}]
    )
    code, _out, err = check(capsys, str(config))
    assert code == 2 and f"cameras[0].url: cannot read {a}: Permission denied" in err


def test_no_files_validates_the_config_alone(tmp_path, capsys):
    config = write(
        tmp_path / "c.yaml",
        model={"path": "/models/yolov8n.onnx"},
        cameras=[{"id": "a", "url": "/clips/a.mp4"}],
    )
    code, out, _err = check(capsys, str(config), "--no-files")
    assert code == 0
    assert out.strip() == f"{config}: ok (1 camera, model yolov8n.onnx; files not checked)"


def test_until_done_errors_name_the_config_file(tmp_path, capsys):
    model, (a,) = files(tmp_path, "a.mp4")
    config = write(
        tmp_path / "c.yaml",
        model={"path": str(model)},
        cameras=[
            {"id": "a", "url": str(a), "loop": True},
            {"id": "b", "url": str(tmp_path / "nope.mp4")},
        ],
    )
    code, _out, err = check(capsys, str(config), "--until-done")
    assert code == 2
    assert err.startswith(f"invalid config {config} (2 errors):")  # not "--until-done"
    assert "  - cameras[0].loop: a looping file never ends" in err
    assert "  - cameras[1].url: file not found" in err


# --- http.listen: off ---------------------------------------------------------------------------
def _parse(http_yaml: str):
    data = yaml.safe_load(f"model: {{path: m.onnx}}\ncameras: [{{id: a, url: a.mp4}}]\n{http_yaml}")
    return parse_config(data, base_dir=Path("/tmp"), source="c.yaml", environ={})


@pytest.mark.parametrize(
    "http_yaml",
    [
        "http: {listen: off}",  # YAML 1.1: the boolean false
        "http: {listen: Off}",
        "http: {listen: 'off'}",
        "http: {listen: false}",
        "http: {listen: null}",
    ],
)
def test_off_in_the_config_means_no_endpoint(http_yaml: str) -> None:
    assert _parse(http_yaml).http.listen is None


@pytest.mark.parametrize(
    ("http_yaml", "expected"),
    [
        ("http: {listen: on}", "http.listen: expected host:port, off or null, got true"),
        ("http: {listen: 'of'}", "http.listen: expected host:port (port 0-65535"),
    ],
)
def test_other_listen_values_are_errors(http_yaml: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _parse(http_yaml)
    assert any(line.startswith(expected) for line in raised.value.errors), raised.value.errors


def test_http_off_on_the_command_line_takes_the_same_path(tmp_path):
    config = load_config(
        write(tmp_path / "c.yaml", model={"path": "m.onnx"}, cameras=[{"id": "a", "url": "a.mp4"}])
    )
    assert config.http.listen == "127.0.0.1:9108"
    assert with_http_listen(config, "off").http.listen is None
    assert with_http_listen(config, "127.0.0.1:0").http.listen == "127.0.0.1:0"
    with pytest.raises(ConfigError) as raised:
        with_http_listen(config, "9108")
    assert raised.value.source == "--http"
    assert raised.value.errors[0].endswith("got '9108'; off: no HTTP endpoint")


def test_run_until_done_errors_name_the_config_file_too(tmp_path, capsys):
    config = write(
        tmp_path / "c.yaml",
        model={"path": "m.onnx"},
        cameras=[{"id": "a", "url": "a.mp4", "loop": True}],
    )
    assert main(["run", str(config), "--until-done"]) == 2  # before anything is started
    err = capsys.readouterr().err
    assert err.startswith(f"invalid config {config} (1 error):")
    assert "  - cameras[0].loop: a looping file never ends" in err
