"""The markdown report of ``framebatch bench``, from what
:mod:`framebatch_tools.bench.pipeline` measured.

Everything is in seconds in the figures and in milliseconds here; no measuring happens here.
"""

from __future__ import annotations

from typing import Any

# per-frame stage key → (what it is, which process or thread pays for it)
STAGES = {
    "decode": ("PyAV decode + to_ndarray(bgr24), CPU", "decoder process"),
    "letterbox": ("letterbox (resize + pad), CPU", "decoder process"),
    "frame_xadd": ("frame {transport} encode + XLEN + XADD ({shape}x3)", "decoder process"),
    "xreadgroup": ("XREADGROUP + from_fields + pixels out", "batcher reader"),
    "prepare": ("Detector.prepare (BGR→RGB, NCHW, /255)", "batcher reader"),
    "postprocess": ("postprocess (decode + NMS)", "batcher publisher"),
    "det": ("detection message + XADD", "batcher publisher"),
    "ack": ("XACK + XDEL of the frames", "batcher publisher"),
}


def ms(seconds: float | None, digits: int = 1) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.{digits}f}"


def rule(columns: int) -> str:
    """Header rule: the first column left-aligned, the figures right-aligned."""
    return "|---|" + "---:|" * (columns - 1)


def median_round(data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The round whose ratio is the median (the lower one of two): its parts add up exactly."""
    ranked = sorted(enumerate(data["rounds"], 1), key=lambda r: r[1]["compare"]["ratio_wall"])
    return ranked[(len(ranked) - 1) // 2]


def format_report(data: dict[str, Any]) -> str:
    sections = (header, detector_alone, pipeline_rounds, ratio, where_the_time_goes, per_frame)
    return "\n".join(line for section in sections for line in [*section(data), ""])


def header(data: dict[str, Any]) -> list[str]:
    m = data["machine"]
    loads = " → ".join(" ".join(f"{v:.2f}" for v in m[k]) for k in ("load_before", "load_after"))
    versions = " / ".join(m[k] for k in ("python", "onnxruntime", "numpy", "av"))
    clips = ", ".join(
        f"{c['camera']} {c['size']} ({c['frames']} frames, decode {ms(c['decode_s'] / c['frames'])}"
        " ms/frame)"
        for c in data["clips"]
    )
    return [
        "# framebatch bench",
        "",
        f"```\n$ {data['command']}\n```",
        "",
        "| machine | |",
        "|---|---|",
        f"| platform | {m['platform']} |",
        f"| CPU | {m['cpu_model']}, os.cpu_count() = {m['cpu_count']} |",
        f"| python / onnxruntime / numpy / av | {versions} |",
        f"| load average (1, 5, 15 min) before → after | {loads} |",
        "",
        f"Config `{data['config']}`: {clips}. Rounds: {len(data['rounds'])}, each the detector "
        f"alone ({data['repeats']} timed calls per batch size after one warm-up) then the "
        "pipeline; figures are medians (shared, noisy machine).",
    ]


def detector_alone(data: dict[str, Any]) -> list[str]:
    rounds, med = data["rounds"], data["medians"]
    per_round = "".join(f" round {i} img/s |" for i in range(1, len(rounds) + 1))
    lines = [
        "## 1. Detector alone (prepare + infer + postprocess, real letterboxed frames)",
        "",
        f"| batch |{per_round} **median img/s** | infer ms/img | prepare ms/img | "
        "postprocess ms/img |",
        rule(len(rounds) + 5),
    ]
    for size, f in med["alone"].items():
        per_round = "".join(f" {r['alone'][size]['images_per_s']:.2f} |" for r in rounds)
        lines.append(
            f"| {size} |{per_round} **{f['images_per_s']:.2f}** | {ms(f['infer_per_image_s'])} | "
            f"{ms(f['prepare_per_image_s'], 2)} | {ms(f['postprocess_per_image_s'], 2)} |"
        )
    best = med["best_batch_size"]
    fps = med["alone"][str(best)]["images_per_s"]
    return [*lines, "", f"Best: **{fps:.2f} images/s at batch {best}** (median over rounds)."]


def pipeline_rounds(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 2. Pipeline end to end (`--until-done`, embedded redis-server)",
        "",
        "frames/s over the wall time from the batcher's start (the run summary's) and over the "
        "processing window (first → last published batch). Inference ms/image is timed by a "
        "TimedDetector wrapped around the pipeline's own detector; busy is its inference time "
        "over its first → last inference.",
        "",
        "| round | frames | dropped | mean batch | wall s | frames/s wall | frames/s window | "
        "p50 ms | p99 ms | infer ms/img | alone ms/img | busy |",
        rule(12),
    ]
    numbered = [(i, {**r["pipeline"], **r["compare"]}) for i, r in enumerate(data["rounds"], 1)]
    medians = {**data["medians"]["pipeline"], **data["medians"]["compare"]}
    for name, p in [*numbered, ("**median**", medians)]:
        lines.append(
            f"| {name} | {p['processed']:.0f} | {p['dropped']:.0f} | {p['mean_batch_size']:.2f} | "
            f"{p['wall_s']:.1f} | {p['fps_wall']:.2f} | {p['fps_window']:.2f} | "
            f"{ms(p['latency_p50_s'], 0)} | {ms(p['latency_p99_s'], 0)} | "
            f"{ms(p['infer_per_image_s'])} | {ms(p['alone_infer_per_image_s'])} | "
            f"{p['infer_busy_fraction']:.0%} |"
        )
    return lines


def ratio(data: dict[str, Any]) -> list[str]:
    lines = [
        "## 3. Pipeline frames/s ÷ detector-alone images/s (its best batch size, same round)",
        "",
        "| round | pipeline frames/s | alone img/s (batch) | ratio (wall) | ratio (window) |",
        rule(5),
    ]
    for i, r in enumerate(data["rounds"], 1):
        c = r["compare"]
        lines.append(
            f"| {i} | {r['pipeline']['fps_wall']:.2f} | {c['alone_images_per_s']:.2f} "
            f"({c['best_batch_size']}) | {c['ratio_wall']:.3f} | {c['ratio_window']:.3f} |"
        )
    c, target = data["medians"]["compare"], data["target_ratio"]
    lines.append(f"| **median** | | | **{c['ratio_wall']:.3f}** | {c['ratio_window']:.3f} |")
    short = target - c["ratio_wall"]
    verdict = "met" if short <= 0 else f"short by {short:.3f} ({short / target:.1%} of the target)"
    return [*lines, "", f"Target ≥ {target:.2f}: **{verdict}**."]


def where_the_time_goes(data: dict[str, Any]) -> list[str]:
    number, r = median_round(data)
    p, c = r["pipeline"], r["compare"]
    frames, wall = p["processed"], p["wall_s"]
    return [
        "### Where the time goes",
        "",
        f"Round {number} (the median ratio): the detector alone would process its {frames} "
        f"frames in {c['ideal_s']:.1f} s ({c['alone_images_per_s']:.2f} img/s at batch "
        f"{c['best_batch_size']}); the pipeline took {wall:.1f} s "
        f"({wall - c['ideal_s']:+.1f} s). Inference slowed by sharing "
        f"{data['machine']['cpu_count']} cores with decode and plumbing: "
        f"{ms(c['infer_slowdown_per_image_s'])} ms/image ({ms(p['infer_per_image_s'])} in the "
        f"pipeline vs {ms(c['alone_infer_per_image_s'])} alone), {c['infer_slowdown_s']:+.1f} s; "
        f"start-up (run start → first inference: Redis, decoder spawn, model load and warm-up) "
        f"{p['startup_s']:.1f} s; detector idle between batches {p['idle_s']:.1f} s (busy "
        f"{p['infer_busy_fraction']:.0%}); tail (last inference → summary) {p['tail_s']:.1f} s; "
        f"less {c['overlapped_s']:.1f} s of prepare + postprocess, which the pipeline runs on "
        "other threads beside inference.",
    ]


def per_frame(data: dict[str, Any]) -> list[str]:
    costs, best = data["per_frame_s"], data["medians"]["best_batch_size"]
    infer = data["medians"]["alone"][str(best)]["infer_per_image_s"]
    lines = [
        "## 4. Per-frame cost of everything that is not inference",
        "",
        "Each stage timed on its own on real frames: decode and letterbox over every frame of the "
        f"clips, Redis steps on a private redis-server, prepare and postprocess at batch {best} "
        f"(detector alone). % of the detector alone's inference, {ms(infer)} ms/image at batch "
        f"{best}.",
        "",
        "| stage | runs in | ms/frame | % of inference |",
        "|---|---|---:|---:|",
    ]
    for key, (label, where) in STAGES.items():
        height, width = data.get("input_shape") or (data["imgsz"], data["imgsz"])
        label = label.format(shape=f"{width}x{height}", transport=data.get("transport", "raw"))
        lines.append(f"| {label} | {where} | {ms(costs[key], 2)} | {costs[key] / infer:.1%} |")
    total = sum(costs[key] for key in STAGES)
    return [*lines, f"| **total** | | **{ms(total, 2)}** | **{total / infer:.1%}** |"]
