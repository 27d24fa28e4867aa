"""``framebatch`` command line: run, consume, check-config, bench, export, simulate."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.errors import (
    EXIT_BAD_INPUT,
    EXIT_CAMERA_ERRORS,
    EXIT_OK,
    EXIT_RUN_FAILED,
    FramebatchError,
)

log = logging.getLogger("framebatch")


def _install_stop_handlers(stop, on_exit_now=lambda: None) -> None:
    """First SIGINT/SIGTERM: stop gracefully. Second: ``on_exit_now()``, then exit now."""

    def handle(signum: int, _frame: object) -> None:
        if stop.is_set():
            on_exit_now()
            os._exit(128 + signum)
        log.warning(
            "%s received: finishing the batch in flight (again to exit now)",
            signal.Signals(signum).name,
        )
        stop.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


def _print_event(event: dict[str, str]) -> None:
    name = event.get("event", "")
    line = f"camera {event.get('camera')}: {name} {event.get('message', '')}".rstrip()
    if name in ("error", "crashed"):
        log.error("%s", line)
    else:
        log.info("%s", line)


def _report(exc: FramebatchError) -> int:
    """One line (a config error: one per problem) on stderr; the error's exit code."""
    from pipeline.config import ConfigError

    print(exc if isinstance(exc, ConfigError) else f"framebatch: {exc}", file=sys.stderr)
    return exc.exit_code


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from pipeline.daemon import Pipeline

    try:
        config = load_config(args.config)
        http = getattr(args, "http", None)
        if http is not None:
            config = with_http_listen(config, None if http == "off" else http)
        role = getattr(args, "role", "all")
        device = getattr(args, "device", None)
        if device is not None:
            config = with_worker_device(config, device)
        pipeline = Pipeline(
            config,
            until_done=getattr(args, "until_done", False),
            on_event=_print_event,
            config_dir=Path(args.config).absolute().parent,
            role=role,
            device=device,
            worker_id=getattr(args, "worker_id", None),
        )
        _install_stop_handlers(pipeline.stop, pipeline.abandon)
        if pipeline.until_done and sys.stderr.isatty():
            summary = _run_with_progress(pipeline)
        else:
            summary = pipeline.run()
    except FramebatchError as exc:
        return _report(exc)
    if role == "decode":  # the frames' fate is the detector workers' summary
        return EXIT_CAMERA_ERRORS if pipeline.failed_cameras() else EXIT_OK
    print(summary.format())
    if getattr(args, "summary_json", None):
        Path(args.summary_json).write_text(json.dumps(summary.to_json(), indent=2))
    # a camera removed through the API was given up by the operator, not failed by its source
    failed = [c for c in summary.cameras if c.failed and c.camera not in pipeline.removed]
    return EXIT_CAMERA_ERRORS if failed else EXIT_OK


def _run_with_progress(pipeline):
    """The run with a progress bar per camera on the terminal, log lines above them."""
    from pipeline.cli.progress import ProgressBars, expected_frames

    totals = {camera.id: expected_frames(camera) for camera in pipeline.config.cameras}

    def views():
        control = pipeline.control  # set once the run has started
        return control.cameras() if control else None

    bars = ProgressBars(sys.stderr, views, totals)
    root = logging.getLogger()
    handlers = root.handlers[:]
    root.handlers = [bars.log_handler(handler) for handler in handlers]
    bars.start()
    try:
        return pipeline.run()
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
    """The config with ``--http`` in place of ``http.listen`` (validated as the config is)."""
    from pydantic import ValidationError

    from pipeline.config import ConfigError, HttpConfig, format_validation_errors

    try:
        http = HttpConfig(listen=listen, token=config.http.token)
    except ValidationError as exc:
        raise ConfigError(format_validation_errors(exc, HttpConfig), "--http") from None
    return config.model_copy(update={"http": http})


REDIS_URL_ENV = "FRAMEBATCH_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def consume_redis_url(args: argparse.Namespace, environ=os.environ) -> str:
    """``--redis``, else ``--redis-file``, else $FRAMEBATCH_REDIS_URL, else the local default.
    A password on the command line is visible to every user in ``ps``: say so."""
    if args.redis:
        from streams.urls import redact_url

        if redact_url(args.redis) != args.redis:
            log.warning(
                "the password in --redis is visible to other users in ps: "
                "use $%s or --redis-file instead",
                REDIS_URL_ENV,
            )
        return args.redis
    if args.redis_file:
        return Path(args.redis_file).read_text().strip()
    return environ.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL


def cmd_consume(args: argparse.Namespace) -> int:
    import redis

    from streams.consumer import DetectionConsumer
    from streams.keys import StreamKeys
    from streams.redis_access import describe_redis_error
    from streams.redis_connect import connect, is_outage

    try:
        url = consume_redis_url(args)
        client = connect(url, reconnect_timeout_s=args.reconnect_timeout, cluster=args.cluster)
    except (OSError, ValueError) as exc:
        print(f"framebatch consume: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except redis.RedisError as exc:  # a cluster client reads the slot map at once
        print(f"framebatch consume: {describe_redis_error(exc, url)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    consumer = DetectionConsumer(
        client,
        StreamKeys(args.prefix),
        cameras=args.camera or (),
        from_start=args.from_start,
        group=args.group,
        dedupe=not args.keep_duplicates,
    )
    try:
        for message in consumer.messages(count=args.count, timeout_s=args.timeout):
            print(json.dumps(message.to_json()), flush=True)
    except KeyboardInterrupt:
        pass
    except redis.RedisError as exc:
        print(f"framebatch consume: {describe_redis_error(exc, url)}", file=sys.stderr)
        return EXIT_RUN_FAILED if is_outage(exc) else EXIT_BAD_INPUT
    finally:
        client.close()
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_config
    from pipeline.supervisor.builders import check_run_mode

    try:
        config = load_config(args.config)
        check_run_mode(config, until_done=args.until_done)
    except ConfigError as exc:
        return _report(exc)
    print(f"{args.config}: ok ({len(config.cameras)} cameras, model {config.model.path.name})")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    if args.peer:
        from framebatch_tools.bench.peer import run_bench_peer

        args.config = args.config or "configs/bench-peer.yaml"
        return run_bench_peer(args)
    if args.mixed_shapes:
        from framebatch_tools.bench.shapes import run_bench_shapes

        args.config = args.config or "configs/bench-peer.yaml"  # its model takes any H×W
        return run_bench_shapes(args)
    from framebatch_tools.bench.pipeline import run_bench

    args.config = args.config or "configs/bench.yaml"
    return run_bench(args)


def cmd_bench_transport(args: argparse.Namespace) -> int:
    from framebatch_tools.bench.transport import run_bench_transport

    return run_bench_transport(args)


def cmd_export(args: argparse.Namespace) -> int:
    from detectors.base import BackendUnavailable
    from detectors.export import ExportRequest, export

    request = ExportRequest(
        source=Path(args.model),
        format=args.format,
        output=Path(args.output) if args.output else None,
        imgsz=args.imgsz,
        max_batch=args.max_batch,
        opt_batch=args.opt_batch,
        rect=args.rect,
        half=args.half,
        int8=args.int8,
        calib_clips=tuple(Path(clip) for clip in args.calib_clips or ()),
        calib_frames=args.calib_frames,
        device=args.device,
    )
    try:
        if not request.source.is_file():
            raise FileNotFoundError(f"model file not found: {request.source}")
        written = export(request)
    except (ValueError, FileNotFoundError, BackendUnavailable) as exc:
        print(f"framebatch export: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {written} ({written.stat().st_size / 1e6:.1f} MB)")
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from pipeline.cli.models import run_models

    return run_models(args)


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    from framebatch_tools.bench.gpu import main as bench_gpu

    return bench_gpu(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    from framebatch_tools.simulate.sweep import run_simulate

    return run_simulate(args)


def cmd_drain(args: argparse.Namespace) -> int:
    import redis

    from pipeline.config import ConfigError, load_config
    from pipeline.ledger.accounting import Accounting
    from pipeline.ledger.acks import FrameAcks
    from pipeline.ledger.earlier_runs import drain
    from streams.keys import StreamKeys
    from streams.redis_access import describe_redis_error
    from streams.redis_connect import connect

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _report(exc)
    if not config.redis.url:
        print(
            "framebatch drain: the config has no redis.url (a private Redis keeps nothing)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    cameras = [camera.id for camera in config.cameras]
    keys = StreamKeys(config.redis.prefix)
    try:
        with connect(
            config.redis.url, reconnect_timeout_s=0, cluster=config.redis.cluster
        ) as client:
            accounting = Accounting(cameras)
            acks = FrameAcks(
                redis_client=client, keys=keys, ledger_maxlen=config.redis.detections_maxlen
            )
            drained = drain(client, keys, cameras, accounting=accounting, acks=acks)
    except redis.RedisError as exc:
        print(f"framebatch drain: {describe_redis_error(exc, config.redis.url)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    left = {c.camera: c.previous_run for c in accounting.summary().cameras if c.previous_run}
    print(f"drained {drained} entries; frames of earlier runs written to the ledger: {left}")
    return EXIT_OK


def cmd_chaos(args: argparse.Namespace) -> int:
    from framebatch_tools.chaos.faults import main as chaos

    return chaos(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="framebatch", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the pipeline daemon on a config")
    run.add_argument("config", help="YAML config file")
    run.add_argument(
        "--until-done",
        action="store_true",
        help="replay mode: exit once every file source is processed",
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
        "decode", help="run only the config's decoders (detector workers run elsewhere)"
    )
    decode.add_argument("config", help="YAML config file (its redis.url is the shared Redis)")
    decode.set_defaults(handler=cmd_run, role="decode")

    detect = commands.add_parser(
        "detect",
        help="run one detector worker; workers share the config's cameras through leases",
    )
    detect.add_argument("config", help="YAML config file (its redis.url is the shared Redis)")
    detect.add_argument("--device", help="cpu, cuda or cuda:N (default: model.device)")
    detect.add_argument(
        "--worker-id",
        help="this worker's name in the leases and the consumer group, unique among the "
        "workers (e.g. the pod name; default: host-pid-random)",
    )
    detect.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON")
    detect.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve metrics, health and live view here instead of http.listen (off: none)",
    )
    detect.set_defaults(handler=cmd_run, role="detect")

    consume = commands.add_parser("consume", help="print detections as JSON lines")
    consume.add_argument(
        "--redis",
        help=f"Redis URL (default: ${REDIS_URL_ENV}, else {DEFAULT_REDIS_URL}); a password "
        "here shows in ps, so prefer the variable or --redis-file",
    )
    consume.add_argument("--redis-file", metavar="PATH", help="read the Redis URL from a file")
    consume.add_argument(
        "--reconnect-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="ride out a Redis outage this long (default: %(default)s)",
    )
    consume.add_argument(
        "--cluster", action="store_true", help="the URL is a node of a Redis Cluster"
    )
    consume.add_argument("--prefix", default="fb", help="key prefix (default: %(default)s)")
    consume.add_argument("--camera", action="append", help="camera id (repeatable; default: all)")
    consume.add_argument(
        "--from-start", action="store_true", help="start at the oldest message kept"
    )
    consume.add_argument("--count", type=int, help="exit after N messages")
    consume.add_argument("--timeout", type=float, help="exit after S seconds with no new message")
    consume.add_argument("--group", help="durable consumer group; acknowledges what it printed")
    consume.add_argument(
        "--keep-duplicates",
        action="store_true",
        help="print a frame's detections again when a restart re-published them "
        "(default: skip repeats of a frame_id)",
    )
    consume.set_defaults(handler=cmd_consume)

    check = commands.add_parser("check-config", help="validate a config and list every error")
    check.add_argument("config")
    check.add_argument("--until-done", action="store_true", help="also check it suits --until-done")
    check.set_defaults(handler=cmd_check_config)

    bench = commands.add_parser(
        "bench", help="measure the detector alone and the pipeline end to end"
    )
    bench.add_argument(
        "--config",
        help="pipeline config to replay (default configs/bench.yaml; with --peer "
        "configs/bench-peer.yaml)",
    )
    bench.add_argument(
        "--peer",
        choices=["ultralytics"],
        help="instead: framebatch against this peer on the same frames and model, "
        "alternating rounds (needs the ultralytics extra)",
    )
    bench.add_argument(
        "--live",
        type=float,
        metavar="SECONDS",
        help="with --peer: the config's clips as live RTSP cameras at their native rate, "
        "each side measured for this long (frames/s, p99 latency, drops)",
    )
    bench.add_argument(
        "--mixed-shapes",
        action="store_true",
        help="instead: a batch of 16:9 and 4:3 frames run per shape against padded to one "
        "shape (throughput and how far padding moves the boxes)",
    )
    bench.add_argument("--batch-sizes", default="1,4,8", help="detector-alone batch sizes")
    bench.add_argument("--repeats", type=int, default=5, help="timed batches per size and round")
    bench.add_argument(
        "--rounds", type=int, default=1, help="alternating rounds of detector/pipeline"
    )
    bench.add_argument("--output", metavar="PATH", help="write the figures as JSON")
    bench.set_defaults(handler=cmd_bench)

    transport = commands.add_parser(
        "bench-transport", help="frames/s through Redis of each frame transport (raw, jpeg, shm)"
    )
    transport.add_argument("--transports", default="raw,jpeg,shm", help="comma-separated")
    transport.add_argument("--producers", type=int, default=2, help="producer processes")
    transport.add_argument("--frames", type=int, default=3000, help="frames per producer at most")
    transport.add_argument("--seconds", type=float, default=8.0, help="seconds per trial at most")
    transport.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    transport.add_argument("--jpeg-quality", type=int, default=90, help="jpeg quality 1-100")
    transport.add_argument("--clip", help="video whose frames are pushed (default: a shared clip)")
    transport.add_argument("--redis-url", help="an existing Redis (default: a private one)")
    transport.add_argument("--tcp", action="store_true", help="private Redis on loopback TCP")
    transport.add_argument("--output", metavar="PATH", help="write the figures as JSON")
    transport.set_defaults(handler=cmd_bench_transport)

    bench_gpu = commands.add_parser(
        "bench-gpu", help="the device path piece by piece (batch sizes, FP16, buffering, graphs)"
    )
    from framebatch_tools.bench.gpu import add_arguments as add_bench_gpu_arguments
    from pipeline.cli.models import add_models_arguments

    add_bench_gpu_arguments(bench_gpu)
    bench_gpu.set_defaults(handler=cmd_bench_gpu)

    export = commands.add_parser(
        "export", help="export a .pt to ONNX, TorchScript or a TensorRT engine"
    )
    export.add_argument("model", help="Ultralytics .pt (or an .onnx for --format engine)")
    export.add_argument("--format", choices=["onnx", "torchscript", "engine"], required=True)
    export.add_argument("--output", metavar="PATH", help="default: the model with the new suffix")
    export.add_argument("--imgsz", type=int, default=640, help="input size (default: %(default)s)")
    export.add_argument(
        "--max-batch", type=int, default=32, help="engine profile max (default: %(default)s)"
    )
    export.add_argument(
        "--opt-batch",
        type=int,
        default=8,
        help="engine profile optimum: the batcher's preferred size (default: %(default)s)",
    )
    export.add_argument(
        "--rect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engine profile over heights and widths up to --imgsz, for rectangular batches "
        "(model.rect); --no-rect: the square only (default: rect)",
    )
    export.add_argument(
        "--half", action="store_true", help="FP16 (engine; onnx/torchscript on CUDA)"
    )
    export.add_argument("--int8", action="store_true", help="INT8 engine, calibrated on real clips")
    export.add_argument("--calib-clips", nargs="+", metavar="CLIP", help="clips for --int8")
    export.add_argument(
        "--calib-frames", type=int, default=256, help="frames for --int8 (default: %(default)s)"
    )
    export.add_argument("--device", default="cpu", help="cpu or cuda:N (default: %(default)s)")
    export.set_defaults(handler=cmd_export)

    models = commands.add_parser("models", help="fetch a known model (yolov8n) into the cache")
    add_models_arguments(models)
    models.set_defaults(handler=cmd_models)

    simulate = commands.add_parser(
        "simulate", help="sweep the batching policies over simulated cameras (no Redis, no model)"
    )
    simulate.add_argument(
        "--profile",
        choices=["all", "cpu_ort_2core", "gpu_a100_trt_model"],
        default="all",
        help="detector service-time profile (default: %(default)s)",
    )
    simulate.add_argument("--quick", action="store_true", help="a small sweep (under a minute)")
    simulate.add_argument(
        "--out", default="docs/img", help="folder for the CSV and PNG plots (default: %(default)s)"
    )
    simulate.add_argument(
        "--seconds", type=float, help="simulated seconds per point at most (default 60; quick 30)"
    )
    simulate.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    simulate.add_argument("--jobs", type=int, help="processes (default: one per CPU)")
    simulate.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    simulate.add_argument(
        "--decisions-bench",
        action="store_true",
        help="only time the policy's decisions for 100-1000 cameras at 30 fps",
    )
    simulate.set_defaults(handler=cmd_simulate)

    drain = commands.add_parser(
        "drain",
        help="account for what stopped runs left in the frames streams (no daemon running)",
    )
    drain.add_argument("config")
    drain.set_defaults(handler=cmd_drain)

    chaos = commands.add_parser(
        "chaos",
        help="inject seeded faults (kills, Redis and RTSP restarts) and audit every frame",
    )
    from framebatch_tools.chaos.faults import add_arguments as add_chaos_arguments

    add_chaos_arguments(chaos)
    chaos.set_defaults(handler=cmd_chaos)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
