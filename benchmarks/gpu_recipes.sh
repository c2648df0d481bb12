#!/usr/bin/env bash
# Validation search of the GPU Transformer recipe in one short GPU call: several variants of
# `seq2seq train --preset transformer` (the GPU defaults plus --compile) train side by side on one GPU
# for MINUTES each (a small model leaves most of the GPU idle, so they share it; each is a little slower
# than alone), validating every 15 s; then each run's validation curve and best checkpoint's test BLEU
# (beam 5) are collected into OUT. Choose on validation only; the test column is for the record.
#
#   bash benchmarks/gpu_recipes.sh DATA_DIR OUT MINUTES "FLAGS A" "FLAGS B" ...
#   bash .gpu/on-device.sh bash benchmarks/gpu_recipes.sh .gpu/multi30k $OUT 2.2 \
#       "--dropout 0.3 --lr 2e-3" "--dropout 0.2 --lr 2e-3" "--dropout 0.3 --lr 1e-3"
set -u
data=$1 out=$2 minutes=$3
shift 3
work=${WORK:-/tmp/gpu-recipes}
rm -rf "$work"; mkdir -p "$work" "$out"
common=(--preset transformer --data-dir "$data" --src de --tgt en --quiet --compile)
# one tokenizer and data cache for every variant (concurrent runs must not write the cache together)
python3 -m seq2seq train "${common[@]}" --no-compile --max-steps 1 --eval-every 0 --no-final-test \
    --output-dir "$work/tokenizer" > "$out/tokenizer.log" 2>&1 || { tail -20 "$out/tokenizer.log"; exit 1; }
n=0
for flags in "$@"; do
    n=$((n + 1)); run="$work/variant$n"; mkdir -p "$run"
    cp "$work/tokenizer/spm.model" "$work/tokenizer/spm.json" "$run/"
    # shellcheck disable=SC2086
    python3 -m seq2seq train "${common[@]}" $flags --max-minutes "$minutes" --eval-every 0 \
        --eval-every-minutes 0.25 --output-dir "$run" > "$out/variant$n.log" 2>&1 &
done
wait
python3 - "$work" "$out" "$@" <<'EOF'
import json, sys
from pathlib import Path
work, out, flags = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
rows = []
for n, variant in enumerate(flags, 1):
    run = work / f"variant{n}"
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").exists() else []
    curve = [(round(r["elapsed"] / 60, 2), r["step"], round(r["bleu"], 2)) for r in metrics if r["kind"] == "valid"]
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    test = (summary.get("test") or {}).get("bleu", {}).get("score")
    rows.append({"flags": variant, "curve": curve, "best_valid_bleu": summary.get("best_valid_bleu"),
                 "test_bleu_beam5": test, "steps": summary.get("steps"),
                 "tok_s": summary.get("train_tgt_tokens_per_s")})
    print(f"{variant}: best valid {summary.get('best_valid_bleu')}, test {test}, steps {summary.get('steps')}, "
          f"tok/s {summary.get('train_tgt_tokens_per_s')}, curve {curve}")
(out / "gpu_recipes.json").write_text(json.dumps(rows, indent=1))
EOF
