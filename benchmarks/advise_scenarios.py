"""8 (model, budget) scenarios: does the top-ranked lever meet the budget when verified, and do
predicted speedups rank the verified levers (Spearman)?"""
import json
import sys
import time

from advisor.engine import AdviceRequest, advise
from advisor.verify import spearman, verify
from kernels_db.store import KernelDB

DB, DEVICE = sys.argv[1], sys.argv[2]
SCEN = [("torchvision:resnet18", 0.8), ("torchvision:resnet18", 0.6),
        ("torchvision:mobilenet_v2", 0.8), ("torchvision:mobilenet_v2", 0.6),
        ("torchvision:resnet34", 0.7), ("torchvision:mobilenet_v3_large", 0.7),
        ("torchvision:squeezenet1_0", 0.8), ("torchvision:resnet50", 0.7)]
out, pooled_p, pooled_m = [], [], []
with KernelDB.open(DB, readonly=True) as db:
    for spec, frac in SCEN:
        t = time.time()
        probe = advise(db, AdviceRequest(spec=spec, device=DEVICE, budget_ms=1e9, levers=("prune",)))
        budget = round(probe.baseline.target_ms * frac, 1)
        a = advise(db, AdviceRequest(spec=spec, device=DEVICE, budget_ms=budget))
        verify(a, 4)
        ver = [r for r in a.results if r.measured_ms]
        top = [r for r in a.results if not r.rejected][0]
        rho = spearman([r.speedup for r in ver], [r.measured_ms["speedup"] for r in ver])
        pooled_p += [r.speedup for r in ver]
        pooled_m += [r.measured_ms["speedup"] for r in ver]
        row = {"spec": spec, "budget_ms": budget, "base_pred_p95": a.baseline.target_ms,
               "base_meas_p95": a.baseline.measured_ms["target"], "top": top.label,
               "top_pred_p95": top.target_ms,
               "top_meas_p95": top.measured_ms and top.measured_ms["target"],
               "top_meets": bool(top.measured_ms and top.measured_ms["target"] <= budget),
               "verified": [(r.label, round(r.speedup, 2), round(r.measured_ms["speedup"], 2)) for r in ver],
               "spearman": rho, "seconds": round(time.time() - t)}
        out.append(row)
        print(json.dumps(row), flush=True)
hits = sum(r["top_meets"] for r in out)
print(json.dumps({"top_meets": f"{hits}/{len(out)}", "pooled_spearman": spearman(pooled_p, pooled_m),
                  "median_scenario_spearman": sorted(r["spearman"] for r in out if r["spearman"] is not None)}))
json.dump(out, open("/tmp/advcheck/scenarios.json", "w"), indent=1)
