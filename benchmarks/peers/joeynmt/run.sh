#!/usr/bin/env bash
# Joey NMT 2.3.0 anchor runs: Multi30k de->en on CPU (torch 2.13.0 CPU build, default 2 threads).
#   bash benchmarks/peers/joeynmt/run.sh all                      # setup, prep, then train+decode+record rnn and transformer
#   bash benchmarks/peers/joeynmt/run.sh setup | prep
#   bash benchmarks/peers/joeynmt/run.sh pilot  rnn|transformer STEPS   # short run to measure s/step (budget estimation)
#   bash benchmarks/peers/joeynmt/run.sh train  rnn|transformer         # budgeted run (STEPS below)
#   bash benchmarks/peers/joeynmt/run.sh decode rnn|transformer         # greedy, beam 5, greedy batch 1 on test_2016_flickr
#   bash benchmarks/peers/joeynmt/run.sh record rnn|transformer         # -> $ROOT/results/joeynmt_<model>.json
# Venv, data, models and logs live under $ANCHORS_TMP (default $TMPDIR/bench-peers, else /tmp/bench-peers). Never run two trainings at once.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ANCH="$(dirname "$HERE")"
ROOT="${ANCHORS_TMP:-${TMPDIR:-/tmp}/bench-peers}"
VENV="$ROOT/venv-joey"
PY="$VENV/bin/python"
export DATA="$ROOT/data"
export RAW="${RAW:-${SEQ2SEQ_MULTI30K:?set SEQ2SEQ_MULTI30K (or RAW) to the Multi30k directory of {split}.{lang} files}}"
mkdir -p "$ROOT/runs" "$ROOT/results"

# --- 12-minute budget: update counts estimated from the pilot runs on this machine (benchmarks/peers/README.md) ---
RNN_STEPS="${RNN_STEPS:-286}"
TF_STEPS="${TF_STEPS:-93}"
# --- transformer LR schedule shared with OpenNMT-py: noam, warmup 30 (4000 scaled to the ~100-200-update
#     budget), factor chosen so the peak lr equals standard noam(factor 2, warmup 4000, d 256) = 1.976e-3 ---
export WARMUP=30 NOAM_FACTOR=0.1732
export LR_STEP1=6.59e-05        # = noam(step 1); Joey applies its scheduler only after the first update
export BEAM_ALPHA=1.0           # Wu length penalty for beam search (same alpha for OpenNMT-py)
DEC_BATCH_DEFAULT=64            # Joey's default testing batch_size (sentences)

batch_sents() { [ "$1" = rnn ] && echo 128 || echo 280; }
log_freq()    { [ "$1" = rnn ] && echo 10 || echo 5; }
steps_for()   { [ "$1" = rnn ] && echo "$RNN_STEPS" || echo "$TF_STEPS"; }

setup() {
  [ -x "$PY" ] || python3 -m venv "$VENV"
  echo "torch==2.13.0" > "$ROOT/torch-pin.txt"
  "$VENV/bin/pip" install torch==2.13.0              # CPU wheel from the local disk
  # joeynmt 2.3.0 requires torch>=1.12.0, so it keeps 2.13.0 (constraint file makes sure).
  # importlib_metadata is imported by joeynmt.helpers but missing from its Requires-Dist.
  # sentencepiece pinned to 0.2.0: 0.2.3 (the newest) dropped SetVocabulary() which Joey calls.
  "$VENV/bin/pip" install -c "$ROOT/torch-pin.txt" joeynmt==2.3.0 sentencepiece==0.2.0 sacrebleu importlib_metadata
  "$PY" "$HERE/patch_joey.py"
  "$VENV/bin/pip" freeze > "$ROOT/results/pip-freeze-$(basename "$HERE").txt"  # provenance, outside the repository
}

prep() { "$PY" "$ANCH/common/prep_data.py"; }

make_cfg() {  # model out steps beam dec_batch load_model
  local model=$1 out=$2
  RUN_DIR="$ROOT/runs/joey-$model/model" STEPS=$3 BEAM=$4 DEC_BATCH=$5 LOAD_MODEL=$6 LOG_FREQ=$(log_freq "$model") \
    envsubst < "$HERE/$model.yaml.in" > "$out"
}

train() {  # model [steps] [tag]
  local model=$1 steps=${2:-$(steps_for "$1")} tag=${3:-train}
  local dir="$ROOT/runs/joey-$model"
  [ "$tag" = pilot ] && dir="$ROOT/runs/joey-$model-pilot"
  rm -rf "$dir"; mkdir -p "$dir"
  make_cfg "$model" "$dir/$tag.yaml" "$steps" 1 $DEC_BATCH_DEFAULT "$ROOT/runs/joey-$model/model/latest.ckpt"
  sed -i "s#model_dir: .*#model_dir: \"$dir/model\"#" "$dir/$tag.yaml"
  cp "$dir/$tag.yaml" "$ROOT/results/joeynmt_${model}.$tag.yaml"
  echo "[joey] $tag $model: $steps updates ($(date))"
  /usr/bin/time -v -o "$dir/time_$tag.txt" "$PY" -m joeynmt train "$dir/$tag.yaml" --skip-test > "$dir/$tag.out" 2>&1
  "$PY" "$ANCH/common/measure.py" train --toolkit joey --log "$dir/model/train.log" \
     --time-v "$dir/time_$tag.txt" --batch-sents "$(batch_sents "$model")" > "$dir/${tag}_stats.json"
  cat "$dir/${tag}_stats.json"
}

decode() {  # model
  local model=$1
  local dir="$ROOT/runs/joey-$model"
  local spec name beam bs
  for spec in "greedy 1 $DEC_BATCH_DEFAULT" "beam5 5 $DEC_BATCH_DEFAULT" "greedy_bs1 1 1"; do
    read -r name beam bs <<< "$spec"
    make_cfg "$model" "$dir/dec_$name.yaml" "$(steps_for "$model")" "$beam" "$bs" "$dir/model/latest.ckpt"
    echo "[joey] decode $model $name (beam $beam, batch $bs sents) ($(date))"
    /usr/bin/time -v -o "$dir/time_dec_$name.txt" "$PY" -m joeynmt translate "$dir/dec_$name.yaml" \
       < "$DATA/test_2016_flickr.de" > "$dir/hyp_$name.txt" 2> "$dir/dec_$name.log"
    "$PY" "$ANCH/common/measure.py" decode --toolkit joey --hyp "$dir/hyp_$name.txt" \
       --ref "$DATA/test_2016_flickr.en" --spm "$DATA/spm8k.model" --toolkit-log "$dir/dec_$name.log" \
       --time-v "$dir/time_dec_$name.txt" > "$dir/dec_${name}_stats.json"
    cp "$dir/hyp_$name.txt" "$ROOT/results/joeynmt_${model}.hyp_$name.txt"
    grep -E '"(bleu|chrf|sents_per_s|tgt_tok_per_s|gen_time_s)"' "$dir/dec_${name}_stats.json" | tr -d '\n'; echo
  done
}

record() {  # model
  local model=$1
  local dir="$ROOT/runs/joey-$model"
  "$PY" - "$model" "$dir/meta.json" "$(steps_for "$model")" "$(batch_sents "$model")" <<'PYEOF'
import json, sys, platform, datetime, os, subprocess, torch, joeynmt, sacrebleu, sentencepiece
model, out, steps, bsz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
common = dict(vocab="joint SentencePiece unigram 8000 (char coverage 1.0) on train.de+train.en; 8001 entries incl. specials",
              batch=f"{bsz} sentences per update (batch_type sentence, random order, no bucketing)",
              budget_target_s=720, steps=steps, decoding_batch_default="64 sentences (Joey default testing.batch_size)",
              beam_length_penalty="Wu alpha=1.0", max_output_length="Joey default: 1.5 x longest source in batch",
              data_loader_workers=0)
if model == "rnn":
    settings = dict(arch="bi-GRU encoder 1 layer, 256 per direction (512 output); GRU decoder 1 layer 512; "
                    "Bahdanau (additive) attention; input feeding (Joey default); decoder init = last encoder "
                    "state (init_hidden: last); emb 256; no tying",
                    dropout="0.3 on src/trg embeddings and on the attentional-layer input (hidden_dropout)",
                    optimizer="Adam(0.9,0.999) lr 3e-4 constant (scheduling 'plateau' never triggered: no validation)",
                    clip_grad_norm=5.0, label_smoothing=0.0, loss_normalization="tokens", init="xavier_uniform (Joey default)")
else:
    settings = dict(arch="Transformer 3+3 layers, d_model 256, 4 heads, FF 1024, pre-norm, ReLU, sinusoidal positions, "
                    "scaled embeddings, tied decoder embedding/softmax (tied_softmax)",
                    dropout=0.1, label_smoothing=0.1, loss_normalization="tokens",
                    optimizer="Adam(0.9,0.98), noam: lr = 0.1732 * 256^-0.5 * min(step^-0.5, step*30^-1.5); peak 1.976e-3 at step 30",
                    clip_grad_norm=1.0, init="xavier_uniform (Joey default)")
settings.update(common)
meta = dict(peer="joeynmt", model=model, date=datetime.datetime.now().isoformat(timespec="seconds"),
            versions=dict(joeynmt=joeynmt.__version__ if hasattr(joeynmt, "__version__") else "2.3.0",
                          torch=torch.__version__, sentencepiece=sentencepiece.__version__,
                          sacrebleu=sacrebleu.__version__, python=platform.python_version()),
            machine=dict(cpu=cpu[0] if cpu else platform.processor(), nproc=os.cpu_count(),
                         torch_threads=torch.get_num_threads(), gpu=False),
            patches=["joeynmt/builders.py: removed `verbose` kwarg of ReduceLROnPlateau (gone in torch 2.13)"],
            install_notes=["joeynmt 2.3.0 installed normally (requires torch>=1.12.0, kept 2.13.0)",
                           "importlib_metadata added by hand (imported by joeynmt.helpers, missing from Requires-Dist)",
                           "sentencepiece pinned to 0.2.0 (0.2.3 has no SetVocabulary(), which Joey calls)",
                           "scheduling 'plateau' used as constant lr: Joey 2.3.0 raises ConfigurationError without a scheduler",
                           "translate mode writes to stdout: `-o` crashes in 2.3.0 (AttributeError: BaseConfig has no n_best)"],
            budget_calibration="steps = 720 s x steps/s of a short pilot (rnn: 40 updates, 0.398 steps/s; transformer: 14 updates, 0.129 steps/s)",
            settings=settings)
json.dump(meta, open(out, "w"), indent=1)
PYEOF
  "$PY" "$ANCH/common/measure.py" record --out "$ROOT/results/joeynmt_${model}.json" --meta "$dir/meta.json" \
     --train "$dir/train_stats.json" --decode greedy="$dir/dec_greedy_stats.json" \
     beam5="$dir/dec_beam5_stats.json" greedy_bs1="$dir/dec_greedy_bs1_stats.json"
}

cmd=${1:-all}; shift || true
case "$cmd" in
  setup) setup ;;
  prep) prep ;;
  pilot) train "$1" "${2:-20}" pilot ;;
  train) train "$1" ;;
  decode) decode "$1" ;;
  record) record "$1" ;;
  all) setup; prep; for m in rnn transformer; do train $m; decode $m; record $m; done ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
