#!/usr/bin/env bash
# The measurements behind the closing notes, in one sequential run on a quiet machine.
# Usage: benchmarks/full_run.sh OUTDIR   (about 100 minutes on the 2-core dev machine)
set -uo pipefail
OUT=${1:-/tmp/hwlat-full}
mkdir -p "$OUT"
PY=${PYTHON:-.venv/bin/python}
H="$PY -m hwlat"
export PYTHONWARNINGS=ignore
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }

for T in 1 2; do
  DB="$OUT/t$T.db"
  log "profile threads=$T"
  /usr/bin/time -f "%e s wall" $H --db "$DB" profile --threads $T --budget 10m --json \
      > "$OUT/profile-t$T.json" 2>> "$OUT/log.txt"
  log "evaluate threads=$T"
  $H --db "$DB" evaluate --threads $T --batch 1 --batch 8 --plot "$OUT/eval-t$T.png" --json \
      > "$OUT/eval-t$T.json" 2>> "$OUT/log.txt"
  log "evaluate unseen architectures threads=$T"
  $H --db "$DB" evaluate $(grep -v '^#' benchmarks/unseen_models.txt) --threads $T --batch 1 \
      --batch 8 --plot "$OUT/unseen-t$T.png" --json > "$OUT/unseen-t$T.json" 2>> "$OUT/log.txt"
  $H --db "$DB" evaluate $(grep -v '^#' benchmarks/unseen_timm.txt) --threads $T --batch 1 \
      --plot "$OUT/timm-t$T.png" --json > "$OUT/timm-t$T.json" 2>> "$OUT/log.txt"
  $H --db "$DB" evaluate $(grep -v '^#' benchmarks/unseen_hf.txt) --threads $T --batch 1 \
      --plot "$OUT/hf-t$T.png" --json > "$OUT/hf-t$T.json" 2>> "$OUT/log.txt"
  $H --db "$DB" evaluate $(grep -v '^#' benchmarks/unseen_hf2.txt) --threads $T --batch 1 \
      --plot "$OUT/hf2-t$T.png" --json > "$OUT/hf2-t$T.json" 2>> "$OUT/log.txt"
done

log "bench resnet18"
$H --db "$OUT/t2.db" bench torchvision:resnet18 --threads 2 --runs 300 --json \
    > "$OUT/bench-resnet18.json" 2>> "$OUT/log.txt"
RATE=$($PY -c "import json;d=json.load(open('$OUT/bench-resnet18.json'));s=d['stages_ms']['forward'];print(round(0.8*1000/s['p50'],1))")
log "load runs at $RATE req/s"
for W in 0 5 20; do
  $H --db "$OUT/t2.db" bench torchvision:resnet18 --threads 2 --rate "$RATE" --duration 30 \
      --workers 1 --max-batch 4 --max-wait-ms $W --seed 1 --json --csv "$OUT/load-w$W.csv" \
      > "$OUT/load-w$W.json" 2>> "$OUT/log.txt"
done
log "advise scenarios (threads=1 profile)"
$PY benchmarks/advise_scenarios.py "$OUT/t1.db" "$($PY -c "import json;print(json.load(open('$OUT/profile-t1.json'))['device_id'])")" \
    > "$OUT/advise.jsonl" 2>> "$OUT/log.txt"
log "simulator vs load"
$PY benchmarks/simulator_vs_load.py "$OUT/t1.db" "$($PY -c "import json;print(json.load(open('$OUT/profile-t1.json'))['device_id'])")" \
    > "$OUT/sim.jsonl" 2>> "$OUT/log.txt"
log "contention: models timed beside a neighbour process"
$PY benchmarks/contention.py > "$OUT/contention.jsonl" 2>> "$OUT/log.txt"
log "done"
