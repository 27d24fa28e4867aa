"""The tooling's ``framebatch`` subcommands (bench, bench-transport, bench-gpu, simulate, chaos),
registered through the ``framebatch.commands`` entry point: the runtime's command line loads
whatever is registered there and never imports this package itself."""

from __future__ import annotations

import argparse
from typing import Any

#: peers ``framebatch bench --peer`` runs side by side (framebatch_tools/bench/peer.py)
PEERS = ("ultralytics",)
#: ``framebatch simulate --quick``'s wall time on the project's 2-core machine, idle, plots
#: included (measured: 10.6-12.2 s; docs/batching.md, "Reproduce").  Here, not in the sweep's
#: module: --help does not import the simulator.
QUICK_WALL_S = 12


def register(commands: Any) -> None:
    """Every tooling command, in the order ``framebatch --help`` lists them."""
    for add in (_bench, _bench_transport, _bench_gpu, _bench_analytics, _simulate, _chaos):
        add(commands)


def _bench(commands: Any) -> None:
    bench = commands.add_parser(
        "bench", help="measure the detector alone and the pipeline end to end"
    )
    bench.add_argument(
        "--config",
        metavar="CONFIG",
        help="pipeline config to replay (default configs/bench.yaml; with --peer "
        "configs/bench-peer.yaml)",
    )
    bench.add_argument(
        "--peer",
        choices=PEERS,
        help="instead: framebatch against this peer on the same frames and model, "
        "alternating rounds (needs the ultralytics extra)",
    )
    bench.add_argument(
        "--live",
        type=float,
        metavar="S",
        help="with --peer: the config's clips as live RTSP cameras at their native rate, "
        "each side measured for S seconds (frames/s, p99 latency, drops)",
    )
    bench.add_argument(
        "--mixed-shapes",
        action="store_true",
        help="instead: a batch of 16:9 and 4:3 frames run per shape against padded to one "
        "shape (throughput and how far padding moves the boxes)",
    )
    bench.add_argument(
        "--batch-sizes",
        default="1,4,8",
        metavar="N,N,...",
        help="detector-alone batch sizes (default: %(default)s)",
    )
    bench.add_argument(
        "--repeats",
        type=int,
        default=5,
        metavar="N",
        help="timed batches per size and round (default: %(default)s)",
    )
    bench.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="alternating rounds of detector/pipeline (default: %(default)s)",
    )
    bench.add_argument("--output", metavar="PATH", help="write the figures as JSON")
    bench.set_defaults(handler=cmd_bench)


def _bench_transport(commands: Any) -> None:
    transport = commands.add_parser(
        "bench-transport", help="frames/s through Redis of each frame transport (raw, jpeg, shm)"
    )
    transport.add_argument(
        "--transports",
        default="raw,jpeg,shm",
        metavar="LIST",
        help="comma-separated transports (default: %(default)s)",
    )
    transport.add_argument(
        "--producers", type=int, default=2, metavar="N", help="producer processes (default: 2)"
    )
    transport.add_argument(
        "--frames",
        type=int,
        default=3000,
        metavar="N",
        help="frames per producer at most (default: %(default)s)",
    )
    transport.add_argument(
        "--seconds",
        type=float,
        default=8.0,
        metavar="S",
        help="seconds per trial at most (default: %(default)s)",
    )
    transport.add_argument(
        "--rounds", type=int, default=3, metavar="N", help="alternating rounds (default: 3)"
    )
    transport.add_argument(
        "--jpeg-quality",
        type=int,
        default=90,
        metavar="N",
        help="jpeg quality 1-100 (default: %(default)s)",
    )
    transport.add_argument(
        "--clip", metavar="PATH", help="video whose frames are pushed (default: a shared clip)"
    )
    transport.add_argument(
        "--redis-url", metavar="URL", help="an existing Redis (default: a private one)"
    )
    transport.add_argument("--tcp", action="store_true", help="private Redis on loopback TCP")
    transport.add_argument("--output", metavar="PATH", help="write the figures as JSON")
    transport.set_defaults(handler=cmd_bench_transport)


def _bench_gpu(commands: Any) -> None:
    from framebatch_tools.bench.gpu import add_arguments

    bench_gpu = commands.add_parser(
        "bench-gpu", help="the device path piece by piece (batch sizes, FP16, buffering, graphs)"
    )
    add_arguments(bench_gpu)
    bench_gpu.set_defaults(handler=cmd_bench_gpu)


def _simulate(commands: Any) -> None:
    from framebatch_tools.simulate.profiles import PROFILES

    simulate = commands.add_parser(
        "simulate", help="sweep the batching policies over simulated cameras (no Redis, no model)"
    )
    simulate.add_argument(
        "--profile",
        choices=["all", *PROFILES],
        default="all",
        help="detector service-time profile (default: %(default)s)",
    )
    simulate.add_argument(
        "--quick",
        action="store_true",
        help=f"a small sweep: 3-4 loads per mix (~{QUICK_WALL_S} s on 2 idle cores, plots "
        "included)",
    )
    simulate.add_argument(
        "--out",
        metavar="PATH",
        help="folder for the CSV and PNG plots (default: a new temporary folder, printed; "
        "the figures of docs/batching.md: --out docs/img)",
    )
    simulate.add_argument(
        "--seconds",
        type=float,
        metavar="S",
        help="simulated seconds per point at most (default 60; quick 30)",
    )
    simulate.add_argument(
        "--seed", type=int, default=0, metavar="N", help="random seed (default: %(default)s)"
    )
    simulate.add_argument(
        "--jobs", type=int, metavar="N", help="processes (default: one per CPU this may use)"
    )
    simulate.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    simulate.add_argument(
        "--decisions-bench",
        action="store_true",
        help="only time the policy's decisions for 100-1000 cameras at 30 fps",
    )
    simulate.set_defaults(handler=cmd_simulate)


def _chaos(commands: Any) -> None:
    from framebatch_tools.chaos.faults import add_arguments

    chaos = commands.add_parser(
        "chaos",
        help="inject seeded faults (kills, Redis and RTSP restarts) and audit every frame",
    )
    add_arguments(chaos)
    chaos.set_defaults(handler=cmd_chaos)


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


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    from framebatch_tools.bench.gpu import main as bench_gpu

    return bench_gpu(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    from framebatch_tools.simulate.sweep import run_simulate

    return run_simulate(args)


def cmd_chaos(args: argparse.Namespace) -> int:
    from framebatch_tools.chaos.faults import main as chaos

    return chaos(args)


def _bench_analytics(commands: Any) -> None:
    bench = commands.add_parser(
        "bench-analytics",
        help="measure a camera's analytics (tracker, line, zone, state) per frame",
    )
    bench.add_argument(
        "--objects",
        default="0,10,50",
        metavar="N,N,...",
        help="objects in view (default: %(default)s)",
    )
    bench.add_argument(
        "--frames", type=int, default=330, metavar="N", help="frames a run (default: %(default)s)"
    )
    bench.add_argument(
        "--repeats", type=int, default=5, metavar="N", help="runs (default: %(default)s)"
    )
    bench.add_argument("--output", metavar="PATH", help="write the figures as JSON here")
    bench.set_defaults(handler=_run_bench_analytics)


def _run_bench_analytics(args: argparse.Namespace) -> int:
    from pathlib import Path

    from framebatch_tools.bench.analytics import run

    return run(
        objects=[int(n) for n in args.objects.split(",")],
        frames=args.frames,
        repeats=args.repeats,
        output=Path(args.output) if args.output else None,
    )
