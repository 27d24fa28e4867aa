"""The README demo: replay the real sample clips in real time as cameras and print detections.

Runs ``configs/demo.yaml`` (looping clips, real-time pace) with a private redis-server for
``--seconds``, prints one line per detection message as a consumer would see it, then stops the
daemon gracefully and prints its summary.  ``python -m samples.demo [--seconds 30]``
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections import Counter
from pathlib import Path

import redis

from pipeline.config import ConfigError, load_config
from pipeline.daemon import Pipeline
from pipeline.errors import EXIT_BAD_INPUT
from pipeline.ledger.summary import RunSummary
from streams.consumer import DetectionConsumer
from streams.embedded_redis import EmbeddedRedis
from streams.keys import StreamKeys
from streams.messages import DetectionMessage

REPO_ROOT = Path(__file__).resolve().parent.parent


def describe(message: DetectionMessage) -> str:
    counts = Counter(d.label for d in message.detections)
    found = ", ".join(f"{n} {label}" for label, n in counts.most_common()) or "nothing"
    return (
        f"{message.camera:>8} #{message.seq:<5} batch {message.batch_id:<4} "
        f"(size {message.batch_size})  {message.latency_s * 1000:5.0f} ms  {found}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "demo.yaml")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to run")
    parser.add_argument(
        "--http",
        default="127.0.0.1:0",
        help="where the live view, metrics and API listen (default: any free loopback port)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_INPUT
    missing = [c.url for c in config.cameras if not c.is_live and not Path(c.url).is_file()]
    if missing:
        print(
            f"python -m samples.demo: {len(missing)} clip(s) of {args.config} missing, such as "
            f"{os.path.normpath(missing[0])}\n"
            "  fetch them with: python -m samples.clips fetch (or make demo)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    with EmbeddedRedis() as server:
        config = config.model_copy(
            update={
                "redis": config.redis.model_copy(update={"url": server.url}),
                "http": config.http.model_copy(update={"listen": args.http}),
            }
        )
        stop = threading.Event()
        started: list[Pipeline] = []
        result: list[RunSummary] = []

        def run() -> None:
            pipeline = Pipeline.init_run(config, stop=stop)
            started.append(pipeline)
            result.append(pipeline.run())

        runner = threading.Thread(target=run, name="demo-pipeline")
        runner.start()
        client = redis.Redis.from_url(server.url)
        consumer = DetectionConsumer(client, StreamKeys(config.redis.prefix), from_start=True)
        timer = threading.Timer(args.seconds, stop.set)
        timer.start()
        shown = False
        try:
            while not stop.is_set() and runner.is_alive():
                if not shown and started and started[0].http_url:
                    url = started[0].http_url
                    print(f"live view: {url}/  metrics: {url}/metrics")
                    shown = True
                for message in consumer.messages(timeout_s=0.5):
                    print(describe(message), flush=True)
        except KeyboardInterrupt:
            pass
        finally:
            timer.cancel()
            stop.set()
            runner.join()
            client.close()
    if result:
        print(result[0].format())
    return 0 if result else 1


if __name__ == "__main__":
    raise SystemExit(main())
