"""Fault injection on real parts: a real redis-server, a real RTSP server and real clips.

``framebatch chaos`` runs the daemon on looping clips, an RTSP camera and a corrupt file, and
injects seeded faults one after another: a decoder or the daemon SIGKILLed (the daemon is then
started again), a second SIGTERM, Redis killed and started again (with its append-only file, or
empty), the RTSP server killed or stopped and started again.  After each fault it checks that
nothing of a dead daemon is left (processes, shared-memory rings) and measures how long until
every camera's frames flow again.  A consumer keeps every detection and ledger entry while the
faults go on (Redis restarts included); at the end the audit checks the invariant: every frame
of every decoder session has a detection (after de-duplication by ``frame_id``) or a ledger
entry that says why not.  Every wait is bounded; traffic goes to loopback only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from framebatch_tools.audit import CameraAudit, audit_entries
from framebatch_tools.chaos.plan import SPLIT_FAULTS, FaultPlan
from framebatch_tools.chaos.processes import alive, cmdline, descendants, wait_until
from framebatch_tools.chaos.report import ChaosReport, FaultResult
from pipeline.config import RedisConfig
from pipeline.ledger.accounting import Accounting
from pipeline.ledger.acks import FrameAcks
from pipeline.ledger.earlier_runs import drain
from streams.embedded_redis import EmbeddedRedis, free_tcp_port
from streams.keys import StreamKeys
from streams.lifeline import tied_to_parent
from streams.redis_connect import connect
from streams.rtsp_replay import RtspReplay, rtsp_server_available
from streams.shm_ring import SHM_DIR

log = logging.getLogger(__name__)

PREFIX = "chaos"
FAULTS = (
    "decoder_kill",
    "daemon_kill",
    "double_sigterm",
    "redis_restart_aof",
    "redis_restart_empty",
    "rtsp_kill",
    "rtsp_stop",
)
RECOVERY_TIMEOUT_S = 90.0
EXIT_TIMEOUT_S = 30.0
READ_BLOCK_MS = 100
LEDGER_MAXLEN = RedisConfig.model_fields["detections_maxlen"].default  # the daemon's default


class Collector:
    """Reads every detection and ledger entry as it is written, through Redis restarts (a
    restart without persistence would otherwise lose what was already published)."""

    def __init__(self, url: str, keys: StreamKeys, cameras: list[str]):
        self._client = connect(url, reconnect_timeout_s=120)
        self._positions = {}
        for camera in cameras:
            self._positions[keys.detections(camera)] = "0"
            self._positions[keys.ledger(camera)] = "0"
        self._keys = keys
        self.entries: dict[str, dict[bytes, dict[bytes, bytes]]] = {k: {} for k in self._positions}
        self.captured: dict[str, float] = {}  # camera -> capture time of its newest detection
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            reply = self._client.xread(self._positions, block=READ_BLOCK_MS)
            for key, entries in reply or []:
                key = key.decode()
                for entry_id, fields in entries:
                    self._positions[key] = entry_id
                    # the same id again after a restart that kept the data is the same entry
                    self.entries[key][entry_id] = fields
                    if b"captured" in fields:
                        camera = fields[b"camera"].decode()
                        captured = float(fields[b"captured"])
                        self.captured[camera] = max(self.captured.get(camera, 0.0), captured)

    def stop(self) -> None:
        time.sleep(1.0)  # what the daemon wrote last
        self._stop.set()
        self._thread.join(10)
        self._client.close()

    def audit(self, camera: str) -> CameraAudit:
        return audit_entries(
            camera,
            self.entries[self._keys.detections(camera)].values(),
            self.entries[self._keys.ledger(camera)].values(),
        )


class Chaos:
    """One seeded run: ``run()`` returns the report; every process it starts, it stops."""

    def __init__(
        self,
        *,
        model: Path,
        cameras: dict[str, dict[str, Any]],
        rtsp_clip: Path | None,
        plan: FaultPlan,
        workdir: Path,
        transport: str = "auto",
    ):
        self._model = model
        self._cameras = dict(cameras)
        self._rtsp_clip = rtsp_clip
        self._plan = plan
        self._rng = plan.rng()
        self._workdir = workdir
        self._transport = transport
        self._aof = workdir / "aof"
        self._port = free_tcp_port()
        self._redis: EmbeddedRedis | None = None
        self._rtsp: RtspReplay | None = None
        self._daemon: subprocess.Popen[bytes] | None = None
        self._exit_codes: list[int] = []
        self._started = time.monotonic()

    # --- the parts --------------------------------------------------------------------------
    def _start_redis(self, *, empty: bool = False) -> None:
        if empty:
            shutil.rmtree(self._aof, ignore_errors=True)
        self._aof.mkdir(parents=True, exist_ok=True)
        self._redis = EmbeddedRedis(port=self._port, aof_dir=self._aof).start()

    def _config(self) -> Path:
        cameras = [{"id": camera, **spec} for camera, spec in self._cameras.items()]
        config = {
            # a short backlog and a freshness deadline, as an operator of live cameras would
            # set them: latency stays bounded under overload, and the stale path is exercised
            "redis": {
                "url": self._redis_url,
                "prefix": PREFIX,
                "reconnect_timeout_s": 60,
                "frames_maxlen": 16,
            },
            "model": {"path": str(self._model), "threads": 2},
            "batching": {"max_batch_size": 8, "max_frame_age_ms": 2000},
            "transport": {"kind": self._transport},
            "cameras": cameras,
        }
        path = self._workdir / "chaos.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    @property
    def _redis_url(self) -> str:
        return f"redis://127.0.0.1:{self._port}/0"

    def _start_daemon(self) -> None:
        log_file = (self._workdir / f"daemon-{len(self._exit_codes)}.log").open("wb")
        command = [sys.executable, "-m", "pipeline.cli", "run", str(self._config_path)]
        self._daemon = subprocess.Popen(
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            **tied_to_parent(command, signal.SIGKILL),  # it dies with the harness
        )
        log_file.close()

    def _reap_daemon(self) -> None:
        assert self._daemon is not None
        try:
            self._exit_codes.append(self._daemon.wait(EXIT_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            self._daemon.kill()
            self._exit_codes.append(self._daemon.wait())

    def _decoders(self) -> list[int]:
        assert self._daemon is not None
        return sorted(pid for pid in descendants(self._daemon.pid) if "spawn_main" in cmdline(pid))

    # --- faults -----------------------------------------------------------------------------
    def _inject(self, kind: str) -> tuple[list[str], float | None]:
        """Apply one fault; returns what was left behind and when the fault ended (the
        moment from which recovery is timed, epoch seconds like capture times)."""
        assert self._daemon is not None
        leftovers: list[str] = []
        if kind == "decoder_kill":
            decoders = self._decoders()
            if decoders:
                os.kill(self._rng.choice(decoders), signal.SIGKILL)
        elif kind in ("daemon_kill", "double_sigterm"):
            tree = descendants(self._daemon.pid)
            rings = self._rings()
            if kind == "daemon_kill":
                self._daemon.kill()
            else:
                self._daemon.send_signal(signal.SIGTERM)
                time.sleep(0.05)
                self._daemon.send_signal(signal.SIGTERM)
            self._reap_daemon()
            if not wait_until(lambda: not alive(tree), 15):
                leftovers += [f"process {pid}: {cmdline(pid)}" for pid in alive(tree)]
            if not wait_until(lambda: not (rings & self._rings()), 10):
                leftovers += [f"shm ring {name}" for name in rings & self._rings()]
            self._start_daemon()
        elif kind in ("redis_restart_aof", "redis_restart_empty"):
            assert self._redis is not None
            self._redis.crash()
            time.sleep(self._rng.uniform(0.1, 2.0))
            self._start_redis(empty=kind == "redis_restart_empty")
        elif kind in ("rtsp_kill", "rtsp_stop"):
            if self._rtsp is None:
                return leftovers, None
            self._rtsp.kill(signal.SIGKILL if kind == "rtsp_kill" else signal.SIGTERM)
            time.sleep(self._rng.uniform(0.5, 3.0))
            self._rtsp.start()
        else:
            raise ValueError(f"unknown fault {kind!r} (known: {', '.join(FAULTS)})")
        return leftovers, time.time()

    def _rings(self) -> set[str]:
        return {p.name for p in SHM_DIR.glob(f"framebatch-{PREFIX}-*")}

    def _recovered(self, collector: Collector, since: float) -> float | None:
        """Seconds until every camera has detections of a frame captured after ``since``
        (epoch seconds): frames queued before the fault do not count."""
        cameras = list(self._cameras)
        flowing = wait_until(
            lambda: all(collector.captured.get(c, 0.0) > since for c in cameras),
            RECOVERY_TIMEOUT_S,
        )
        return time.time() - since if flowing else None

    # --- the run ----------------------------------------------------------------------------
    def run(self) -> ChaosReport:
        self._workdir.mkdir(parents=True, exist_ok=True)
        results: list[FaultResult] = []
        collector: Collector | None = None
        try:
            self._start_redis(empty=True)
            if self._rtsp_clip is not None:
                self._rtsp = RtspReplay(self._rtsp_clip)
                self._cameras["rtsp"] = {"url": self._rtsp.start()}
            self._config_path = self._config()
            keys = StreamKeys(PREFIX)
            collector = Collector(self._redis_url, keys, list(self._cameras))
            self._start_daemon()
            first = self._recovered(collector, time.time())
            log.info("chaos: frames flowing after %s s", first)
            for index, kind in enumerate(self._plan.schedule(self._rng)):
                time.sleep(self._rng.uniform(*self._plan.interval_s))
                at = time.monotonic() - self._started
                leftovers, ended = self._inject(kind)
                recovered = self._recovered(collector, ended) if ended is not None else None
                results.append(FaultResult(index, kind, round(at, 1), recovered, leftovers))
                log.info(
                    "chaos: fault %d %s, recovered in %s s%s",
                    index,
                    kind,
                    None if recovered is None else round(recovered, 1),
                    f", LEFT {leftovers}" if leftovers else "",
                )
            assert self._daemon is not None
            self._daemon.send_signal(signal.SIGTERM)  # finish what was read, then audit
            self._reap_daemon()
            # what the last run left in its streams, accounted as the next run would
            with connect(self._redis_url) as client:
                keys = StreamKeys(PREFIX)
                acks = FrameAcks(redis_client=client, keys=keys, ledger_maxlen=LEDGER_MAXLEN)
                accounting = Accounting(list(self._cameras))
                drain(client, keys, list(self._cameras), accounting=accounting, acks=acks)
        finally:
            if self._daemon is not None and self._daemon.poll() is None:
                self._daemon.kill()
                self._daemon.wait()
            if collector is not None:
                collector.stop()
            if self._rtsp is not None:
                self._rtsp.stop()
            if self._redis is not None:
                self._redis.stop()
        cameras = [
            {**asdict(a), "dropped": dict(a.dropped)}
            for a in (collector.audit(camera) for camera in self._cameras)
        ]
        return ChaosReport(
            self._plan.seed, results, cameras, self._exit_codes, time.monotonic() - self._started
        )


def default_cameras(assets: Path, samples: Path) -> dict[str, dict[str, Any]]:
    """Looping clips paced like cameras (they shed when the detector falls behind) and a
    corrupt file that loses frames in decoding on every loop."""
    looping = {"realtime": True, "loop": True}
    return {
        "highway": {
            "url": str(assets / "videos" / "highway_traffic_960x540_30fps.mp4"),
            "fps": 6,
            **looping,
        },
        "street": {
            "url": str(assets / "videos" / "street_night_1920x1080_3fps.mp4"),
            "fps": 2,
            **looping,
        },
        "corrupt": {"url": str(samples / "corrupt_truncated.mp4"), "fps": 3, **looping},
    }


def _frame_rate(text: str) -> float:
    value = float(text)
    if not 0 < value <= 30:
        raise argparse.ArgumentTypeError(f"frames per second between 0 and 30, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    repo = Path(__file__).resolve().parents[2]
    parser.add_argument(
        "--faults", type=int, default=10, metavar="N", help="faults to inject (default 10)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
    parser.add_argument(
        "--interval",
        type=float,
        nargs=2,
        default=(3.0, 6.0),
        metavar=("MIN_S", "MAX_S"),
        help="seconds between faults, drawn between the two (default 3 6)",
    )
    parser.add_argument(
        "--kinds",
        metavar="LIST",
        help=f"comma-separated faults (default: all of the topology's: {', '.join(FAULTS)}; "
        f"split: {', '.join(SPLIT_FAULTS)})",
    )
    parser.add_argument(
        "--topology",
        choices=["one-host", "split"],
        default="one-host",
        help="one-host: the daemon (framebatch run) on clips, an RTSP camera and a corrupt "
        "file; split: registry cameras over two decode and two detect workers on hosts of "
        "their own (network namespaces: root) (default: %(default)s)",
    )
    parser.add_argument(
        "--redis",
        choices=["single", "cluster"],
        default="single",
        help="split: one Redis or a three-master Redis Cluster (default: %(default)s)",
    )
    parser.add_argument(
        "--fps",
        type=_frame_rate,
        default=2.0,
        metavar="FPS",
        help="split: each camera's frames per second (default %(default)s)",
    )
    parser.add_argument(
        "--cameras",
        type=int,
        default=8,
        metavar="N",
        help="split: registry cameras, each a tiny clip replayed live (default %(default)s)",
    )
    parser.add_argument(
        "--assets",
        default=str(repo.parent / "shared" / "assets"),
        metavar="PATH",
        help="shared assets folder: its models/yolov8n_fp32_dynbatch.onnx and videos/ "
        "(default: ../shared/assets beside the checkout)",
    )
    parser.add_argument(
        "--transport",
        choices=["auto", "raw", "jpeg", "shm"],
        default="auto",
        help="how frames travel to the batcher (transport.kind; default: %(default)s)",
    )
    parser.add_argument("--no-rtsp", action="store_true", help="no RTSP camera")
    parser.add_argument(
        "--workdir", metavar="PATH", help="folder for logs and Redis files (default: a temp one)"
    )
    parser.add_argument("--output", metavar="PATH", help="write the report as JSON")


def main(args: argparse.Namespace) -> int:
    if args.topology == "split":
        return _main_split(args)
    assets = Path(args.assets)
    model = assets / "models" / "yolov8n_fp32_dynbatch.onnx"
    samples = Path(__file__).resolve().parents[2] / "samples" / "clips"
    kinds = _kinds(args, FAULTS)
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown or not model.is_file():
        why = f"unknown faults {unknown}" if unknown else f"model not found: {model}"
        print(f"framebatch chaos: {why}", file=sys.stderr)
        return 2
    rtsp_clip = None
    if not args.no_rtsp:
        available, why = rtsp_server_available()
        if available:
            rtsp_clip = samples / "testsrc_640x360_15fps.mp4"
        else:
            log.warning("chaos: no RTSP camera: %s", why)
    if rtsp_clip is None:
        kinds = tuple(k for k in kinds if not k.startswith("rtsp")) or ("decoder_kill",)
    workdir = _workdir(args)
    report = Chaos(
        model=model,
        cameras=default_cameras(assets, samples),
        rtsp_clip=rtsp_clip,
        plan=FaultPlan(args.faults, args.seed, tuple(args.interval), kinds),
        workdir=workdir,
        transport=args.transport,
    ).run()
    return _reported(args, report, workdir)


def _kinds(args: argparse.Namespace, known: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k.strip() for k in (args.kinds or ",".join(known)).split(",") if k.strip())


def _workdir(args: argparse.Namespace) -> Path:
    return Path(args.workdir or tempfile.mkdtemp(prefix="framebatch-chaos-"))


def _reported(args: argparse.Namespace, report: ChaosReport, workdir: Path) -> int:
    print(report.format())
    if args.output:
        Path(args.output).write_text(json.dumps(report.to_json(), indent=2))
    failed = report.unaccounted or report.survived < len(report.faults)
    if failed or args.workdir:
        print(f"logs and Redis files: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)  # a temp folder, nothing to look into
    return 1 if failed else 0


def _main_split(args: argparse.Namespace) -> int:
    from framebatch_tools.netns import netns_available

    try:
        from framebatch_tools.chaos.split import run_split  # with the fleet benchmark's parts
    except ModuleNotFoundError as missing:  # its clip generator (samples/) is not installed
        print(f"framebatch chaos --topology split: needs a checkout ({missing})", file=sys.stderr)
        return 2

    kinds = _kinds(args, SPLIT_FAULTS)
    unknown = sorted(set(kinds) - set(SPLIT_FAULTS))
    available, why = netns_available()
    if unknown or not available or args.cameras < 1:
        problem = (
            f"unknown faults {unknown}"
            if unknown
            else f"--topology split needs network namespaces: {why}"
            if not available
            else "--cameras: at least 1"
        )
        print(f"framebatch chaos: {problem}", file=sys.stderr)
        return 2
    workdir = _workdir(args)
    # stopped by a signal, the hosts and their processes are still taken down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    report = run_split(
        cameras=args.cameras,
        fps=args.fps,
        cluster=args.redis == "cluster",
        plan=FaultPlan(args.faults, args.seed, tuple(args.interval), kinds),
        workdir=workdir,
    )
    return _reported(args, report, workdir)
