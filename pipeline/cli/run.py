"""``framebatch run``, ``decode`` and ``detect``: a daemon (or a replay) of each role."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
from pathlib import Path
from typing import Any

from pipeline.cli.common import install_stop_handlers, print_event, report
from pipeline.errors import EXIT_CAMERA_ERRORS, EXIT_OK, FramebatchError


def register(commands: Any) -> None:
    run = commands.add_parser("run", help="run the pipeline daemon on a config")
    run.add_argument("config", metavar="CONFIG", help="YAML config file")
    run.add_argument(
        "--until-done",
        action="store_true",
        help="replay mode: exit once every file source is processed (a progress bar per "
        "camera on a terminal)",
    )
    run.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON")
    run.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve metrics, health, API and live view here instead of http.listen "
        "(default 127.0.0.1:9108; port 0: any free one; off: none)",
    )
    run.set_defaults(handler=cmd_run)

    decode = commands.add_parser(
        "decode",
        help="run one decode worker; decode workers share the registered cameras through "
        "leases (detector workers run elsewhere)",
    )
    decode.add_argument(
        "config", metavar="CONFIG", help="YAML config file (its redis.url is the shared Redis)"
    )
    decode.add_argument(
        "--worker-id",
        metavar="NAME",
        help="this decode worker's name in the leases, unique among the decode workers (e.g. "
        "the pod name; default: host-pid-random)",
    )
    decode.add_argument(
        "--capacity",
        type=_positive,
        metavar="WEIGHT",
        help="the most camera weight (decode_weight, default 1 a camera) this worker takes "
        "(default: decoding.worker_capacity, unset: no limit)",
    )
    decode.add_argument(
        "--summary-json",
        metavar="PATH",
        help="write each camera's end state and decoded frames as JSON at the end",
    )
    decode.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve metrics and health here instead of http.listen (port 0: any free one; "
        "off: none)",
    )
    decode.set_defaults(handler=cmd_decode)

    detect = commands.add_parser(
        "detect",
        help="run one detector worker; workers share the config's cameras through leases",
    )
    detect.add_argument(
        "config", metavar="CONFIG", help="YAML config file (its redis.url is the shared Redis)"
    )
    detect.add_argument(
        "--device", metavar="DEVICE", help="cpu, cuda or cuda:N (default: model.device)"
    )
    detect.add_argument(
        "--worker-id",
        metavar="NAME",
        help="this worker's name in the leases and the consumer group, unique among the "
        "workers (e.g. the pod name; default: host-pid-random)",
    )
    detect.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON")
    detect.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve metrics, health and live view here instead of http.listen (off: none)",
    )
    detect.set_defaults(handler=cmd_detect)


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.daemon import Pipeline

    def compose(config, stop: threading.Event) -> Pipeline:
        return Pipeline.init_run(
            config,
            until_done=args.until_done,
            config_dir=Path(args.config).absolute().parent,
            stop=stop,
            on_event=print_event,
        )

    return _serve(args, compose, progress=args.until_done)


def cmd_detect(args: argparse.Namespace) -> int:
    from pipeline.daemon import Pipeline

    def compose(config, stop: threading.Event) -> Pipeline:
        return Pipeline.init_detect(
            config,
            device=args.device,
            worker_id=args.worker_id,
            config_dir=Path(args.config).absolute().parent,
            stop=stop,
            on_event=print_event,
        )

    return _serve(args, compose)


def cmd_decode(args: argparse.Namespace) -> int:
    """Exits 1 when a camera's source failed: the frames' fate is the detector workers'
    summary, each camera's end is known from its decoder's events."""
    from pipeline.daemon import Pipeline

    tally = DecodeTally()

    def on_event(event: dict[str, str]) -> None:
        tally.on_event(event)
        print_event(event)

    try:
        config = _config(args)
        stop = _stop_signal(config)
        with Pipeline.init_decode(
            config,
            worker_id=args.worker_id,
            capacity=args.capacity,
            stop=stop,
            on_event=on_event,
        ) as pipeline:
            pipeline.run()
    except FramebatchError as exc:
        return report(exc)
    if args.summary_json:
        states = {view.id: view.state for view in pipeline.cameras()}
        Path(args.summary_json).write_text(json.dumps(tally.to_json(states), indent=2))
    return EXIT_CAMERA_ERRORS if pipeline.cameras_in("failed") else EXIT_OK


class DecodeTally:
    """What ``framebatch decode`` knows of its cameras, from their decoders' status events:
    the frames of the sessions that ended (a decoder that crashed sends no count: its
    sessions are counted apart), how the last one ended, the last error.  The frames' fate is
    the detector workers' to report: nothing here reads the frames streams."""

    def __init__(self) -> None:
        self._cameras: dict[str, dict[str, Any]] = {}

    def on_event(self, event: dict[str, str]) -> None:
        camera = self._cameras.setdefault(event.get("camera", ""), _no_sessions())
        name, message = event.get("event", ""), event.get("message", "")
        if name == "ended":
            camera["sessions_ended"] += 1
            camera["end_reason"] = event.get("reason", message)
            camera["decoded"] += int(event.get("frames", 0))
        elif name == "crashed":
            camera["sessions_crashed"] += 1
            camera["end_reason"], camera["error"] = "crashed", message
        elif name == "error":
            camera["error"] = message

    def to_json(self, states: dict[str, str]) -> dict[str, Any]:
        """Every camera of the run (``states``: each one's state at the end), in that order."""
        return {
            "cameras": [
                {"camera": camera, "state": state, **self._cameras.get(camera, _no_sessions())}
                for camera, state in states.items()
            ]
        }


def _no_sessions() -> dict[str, Any]:
    return {"decoded": 0, "sessions_ended": 0, "sessions_crashed": 0, "end_reason": "", "error": ""}


def _serve(args: argparse.Namespace, compose, *, progress: bool = False) -> int:
    try:
        config = _config(args)
        stop = _stop_signal(config)
        if progress and sys.stderr.isatty():
            summary, pipeline = _run_with_progress(config, lambda: compose(config, stop))
        else:
            with compose(config, stop) as pipeline:
                summary = pipeline.run()
    except FramebatchError as exc:
        return report(exc)
    print(summary.format())
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary.to_json(), indent=2))
    # a camera removed through the API was given up by the operator, not failed by its source
    removed = set(pipeline.cameras_in("removed"))
    failed = [c for c in summary.cameras if c.failed and c.camera not in removed]
    return EXIT_CAMERA_ERRORS if failed else EXIT_OK


def _positive(text: str) -> float:
    """A number > 0 (argparse reports the ValueError as a usage error naming the option)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _stop_signal(config) -> threading.Event:
    """The run's stop signal, set by the first SIGINT/SIGTERM; a second exits at once."""
    from pipeline.supervisor.decoders import abandon_rings

    stop = threading.Event()
    install_stop_handlers(stop, lambda: abandon_rings(config.redis.prefix))
    return stop


def _config(args: argparse.Namespace):
    """The config file with ``--http`` and ``--device`` applied; with ``--until-done``, checked
    to suit it here, where its errors can name the file (``Pipeline.init_run`` checks it too,
    for callers without one)."""
    from pipeline.config import ConfigError, load_config
    from pipeline.supervisor.builders import check_run_mode

    config = load_config(args.config)
    try:
        check_run_mode(config, until_done=getattr(args, "until_done", False))
    except ConfigError as exc:
        raise ConfigError(exc.errors, source=args.config) from None
    http = getattr(args, "http", None)
    if http is not None:
        config = with_http_listen(config, http)
    device = getattr(args, "device", None)
    if device is not None:
        config = with_worker_device(config, device)
    return config


def _run_with_progress(config, compose):
    """The run (composed and run) with a progress bar per camera on the terminal, log lines
    above them; the bars are drawn from the run's start, models loading included."""
    from pipeline.cli.progress import ProgressBars, expected_frames

    totals = {camera.id: expected_frames(camera) for camera in config.cameras}
    composed = []  # the pipeline, once composed: the bars have nothing to draw before

    def views():
        return composed[0].cameras() if composed else None

    bars = ProgressBars(sys.stderr, views, totals)
    root = logging.getLogger()
    handlers = root.handlers[:]
    root.handlers = [bars.log_handler(handler) for handler in handlers]
    bars.start()
    try:
        with compose() as pipeline:
            composed.append(pipeline)
            return pipeline.run(), pipeline
    finally:
        bars.close()
        root.handlers = handlers


def with_worker_device(config, device: str):
    """The config with ``--device`` as the model's device (validated as the config is)."""
    from pydantic import ValidationError

    from pipeline.config import ConfigError, ModelConfig, format_validation_errors

    try:
        model = ModelConfig.model_validate(
            {**config.model.model_dump(), "device": device, "devices": None}
        )
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, ModelConfig), "--device") from None
    return config.model_copy(update={"model": model})


def with_http_listen(config, listen: str | None):
    """The config with ``--http`` in place of ``http.listen``, validated as the config is
    (``off`` there and in the config alike: no endpoint)."""
    from pydantic import ValidationError

    from pipeline.config import ConfigError, HttpConfig, format_validation_errors

    try:
        http = HttpConfig(listen=listen, token=config.http.token)
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, HttpConfig), "--http") from None
    return config.model_copy(update={"http": http})
