"""The GPU check: profile an NVIDIA GPU briefly, evaluate models on it, bench one, summarise.

Run by scripts/gpu_check.sh on a GPU machine (everything through `python -m hwlat`, so it checks
the real command line). Each step has its own time limit and the whole check stays within
`--total` seconds; a step that fails is reported in the summary, never hidden. Writes
`gpu_check.json` (everything) into `--out` and prints one summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROFILE_MODELS = ("torchvision:resnet18", "torchvision:mobilenet_v2", "torchvision:vit_b_32",
                  "hf:bert")
# CNNs and transformers, some in the training zoo and some held out (never profiled)
EVAL_MODELS = ("torchvision:resnet18", "torchvision:resnet50", "torchvision:mobilenet_v3_large",
               "torchvision:efficientnet_b0", "torchvision:convnext_tiny",
               "torchvision:resnet34", "torchvision:googlenet", "torchvision:vit_b_32",
               "torchvision:swin_t", "hf:bert", "hf:gpt2")
DTYPES = ("float16", "float32")
BATCHES = (1, 16)


class Deadline:
    def __init__(self, total_s: float) -> None:
        self.end = time.monotonic() + total_s

    def left(self) -> float:
        return self.end - time.monotonic()


def hwlat(db: str, args: list[str], timeout_s: float) -> dict:
    """Run `python -m hwlat --db DB ARGS --json`; the parsed JSON or an `error` entry."""
    cmd = [sys.executable, "-m", "hwlat", "--db", db, *args, "--json"]
    started = time.monotonic()
    print(f"$ {' '.join(cmd[1:])}  (limit {timeout_s:.0f} s)", file=sys.stderr, flush=True)
    if timeout_s < 5:
        return {"error": "skipped: no time left", "cmd": cmd[2:]}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s", "cmd": cmd[2:]}
    elapsed = time.monotonic() - started
    if done.returncode != 0 and not done.stdout.strip():
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {done.returncode}: {tail}", "cmd": cmd[2:], "elapsed_s": elapsed}
    try:
        out = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"error": f"exit {done.returncode}: output is not JSON", "cmd": cmd[2:]}
    if done.returncode != 0:
        out = {"result": out, "error": f"exit {done.returncode}: "
                                       f"{(done.stderr.strip().splitlines() or [''])[-1]}"}
    return {**out, "elapsed_s": elapsed} if isinstance(out, dict) else {"result": out}


def accuracy(report: dict) -> dict:
    """n, MAPE (%) and share within +-10% of one `hwlat evaluate --json` report."""
    models = report.get("models") or []
    pairs = [(m["measured_ms"], m["predicted_ms"]) for m in models
             if m.get("measured_ms") and m.get("predicted_ms") is not None]
    if pairs:
        measured, predicted = np.array(pairs, dtype=float).T
        ape = np.abs(predicted / measured - 1) * 100
        worst = max(models, key=lambda m: abs(m.get("error_pct") or 0.0))
        return {"n": len(pairs), "mape_pct": float(ape.mean()),
                "within_10pct": float(np.mean(ape <= 10 + 1e-9)),
                "worst": f"{worst['spec']} {worst.get('error_pct', float('nan')):+.0f}%"}
    summary = (report.get("summary") or {}).get("hwlat") or {}
    return {"n": summary.get("n", 0), "mape_pct": summary.get("mape_pct"),
            "within_10pct": summary.get("within_10pct"), "worst": None}


def summary_rows(evaluations: dict[str, dict]) -> list[dict]:
    """One row per 'dtype/batch' evaluation: accuracy, or the error that stopped it."""
    rows = []
    for key, report in evaluations.items():
        dtype, batch = key.split("/")
        row = {"dtype": dtype, "batch": int(batch)}
        if report.get("error") and not report.get("models"):
            row.update({"n": 0, "mape_pct": None, "within_10pct": None,
                        "worst": None, "error": report["error"]})
        else:
            row.update(accuracy(report))
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'dtype':<9} {'batch':>5} {'models':>6} {'MAPE':>8} {'within10%':>10}  worst / error"]
    for r in rows:
        mape = "-" if r["mape_pct"] is None else f"{r['mape_pct']:.1f}%"
        within = "-" if r["within_10pct"] is None else f"{r['within_10pct'] * 100:.0f}%"
        lines.append(f"{r['dtype']:<9} {r['batch']:>5} {r['n']:>6} {mape:>8} {within:>10}  "
                     f"{r.get('error') or r.get('worst') or ''}")
    return "\n".join(lines)


def bench_line(report: dict) -> str:
    if report.get("error") and "stages_ms" not in report:
        return f"bench: {report['error']}"
    stages = report.get("stages_ms", {})
    parts = [f"{name} p50 {s['p50']:.3f} ms" for name, s in stages.items() if s.get("p50")]
    warnings = report.get("warnings") or []
    return "bench: " + ", ".join(parts) + (f"; warnings: {'; '.join(warnings)}" if warnings else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", default=".")
    parser.add_argument("--budget", default="4m", help="hwlat profile --budget")
    parser.add_argument("--total", type=float, default=450.0, help="seconds for everything")
    parser.add_argument("--runs", type=int, default=30, help="hwlat evaluate --runs")
    args = parser.parse_args(argv)
    deadline = Deadline(args.total)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S")}

    profile = hwlat(args.db, ["profile", "--device", "cuda", "--budget", args.budget,
                              *[f"--dtype={d}" for d in DTYPES], "--models",
                              ",".join(PROFILE_MODELS), *[f"--batch={b}" for b in BATCHES]],
                    timeout_s=min(deadline.left() - 120, 300))
    result["profile"] = profile
    device = profile.get("device_id") or "cuda"
    if profile.get("device_id"):  # keep the GPU's profile: `hwlat db import` it elsewhere
        export = Path(args.out) / "gpu_profile.jsonl.gz"
        subprocess.run([sys.executable, "-m", "hwlat", "--db", args.db, "db", "export", device,
                        str(export)], timeout=60, check=False)
    evaluations: dict[str, dict] = {}
    for i, (dtype, batch) in enumerate((d, b) for d in DTYPES for b in BATCHES):
        share = (deadline.left() - 45) / (len(DTYPES) * len(BATCHES) - i)
        evaluations[f"{dtype}/{batch}"] = hwlat(
            args.db, ["evaluate", *EVAL_MODELS, "--device", device, "--dtype", dtype,
                      "--batch", str(batch), "--runs", str(args.runs)], timeout_s=share)
    result["evaluate"] = evaluations
    result["bench"] = hwlat(args.db, ["bench", "torchvision:resnet50", "--device", "cuda",
                                      "--dtype", "float16", "--batch", "16", "--runs", "200"],
                            timeout_s=min(deadline.left(), 60))
    rows = summary_rows(evaluations)
    result["summary"] = rows
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str))

    print(f"\n== hwlat GPU check on {device} ==")
    if profile.get("error"):
        print(f"profile: {profile['error']}")
    else:
        print(f"profile: {profile.get('measured_now')} op configs, "
              f"{profile.get('models_measured_now')} models in {profile.get('elapsed_s', 0):.0f} s, "
              f"noise median {profile.get('noise_median')}")
    print(format_table(rows))
    print(bench_line(result["bench"]))
    ok = not profile.get("error") and all(r.get("error") is None for r in rows)
    return 0 if ok and not result["bench"].get("error") else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
