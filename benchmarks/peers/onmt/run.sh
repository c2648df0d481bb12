#!/usr/bin/env bash
# OpenNMT-py 3.5.1 anchor runs: Multi30k de->en on CPU (torch 2.13.0 CPU build, default 2 threads).
#   bash benchmarks/peers/onmt/run.sh all                      # setup, prep, then train+decode+record rnn and transformer
#   bash benchmarks/peers/onmt/run.sh setup | prep
#   bash benchmarks/peers/onmt/run.sh pilot  rnn|transformer STEPS   # short run to measure s/step (budget estimation)
#   bash benchmarks/peers/onmt/run.sh train  rnn|transformer         # budgeted run (STEPS below)
#   bash benchmarks/peers/onmt/run.sh decode rnn|transformer         # greedy, beam 5, greedy batch 1 on test_2016_flickr
#   bash benchmarks/peers/onmt/run.sh record rnn|transformer         # -> $ROOT/results/onmt_<model>.json
# Venv, data, models and logs live under $ANCHORS_TMP (default $TMPDIR/bench-peers, else /tmp/bench-peers). Never run two trainings at once.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ANCH="$(dirname "$HERE")"
ROOT="${ANCHORS_TMP:-${TMPDIR:-/tmp}/bench-peers}"
VENV="$ROOT/venv-onmt"
PY="$VENV/bin/python"
export DATA="$ROOT/data"
export RAW="${RAW:-${SEQ2SEQ_MULTI30K:?set SEQ2SEQ_MULTI30K (or RAW) to the Multi30k directory of {split}.{lang} files}}"
export PYTHONWARNINGS="ignore::FutureWarning"
mkdir -p "$ROOT/runs" "$ROOT/results"

# --- 12-minute budget: update counts estimated from the pilot runs on this machine (benchmarks/peers/README.md) ---
RNN_STEPS="${RNN_STEPS:-546}"
TF_STEPS="${TF_STEPS:-286}"
# --- transformer LR schedule shared with Joey NMT (see anchors/joeynmt/run.sh) ---
export WARMUP=30 NOAM_FACTOR=0.1732
BEAM_ALPHA=1.0                  # Wu length penalty (OpenNMT-py's default would be 'avg')
MAX_LEN_RATIO=1.5               # OpenNMT-py default 1.25; 1.5 ~ Joey's default (1.5 x longest source)
DEC_BATCH_DEFAULT=30            # OpenNMT-py's default translate batch_size (sentences)

batch_sents() { [ "$1" = rnn ] && echo 128 || echo 280; }
log_freq()    { [ "$1" = rnn ] && echo 10 || echo 5; }
steps_for()   { [ "$1" = rnn ] && echo "$RNN_STEPS" || echo "$TF_STEPS"; }

setup() {
  [ -x "$PY" ] || python3 -m venv "$VENV"
  echo "torch==2.13.0" > "$ROOT/torch-pin.txt"
  "$VENV/bin/pip" install torch==2.13.0              # CPU wheel from the local disk
  # OpenNMT-py 3.5.1 pins torch<2.3,>=2.1 -> install it without deps, then its Requires-Dist by hand
  "$VENV/bin/pip" install --no-deps OpenNMT-py==3.5.1
  "$VENV/bin/pip" install -c "$ROOT/torch-pin.txt" configargparse "ctranslate2<5,>=4" "tensorboard>=2.3" flask \
      waitress "pyonmttok<2,>=1.37" pyyaml sacrebleu rapidfuzz pyahocorasick fasttext-wheel spacy six numpy \
      sentencepiece==0.2.0
  "$PY" "$HERE/patch_onmt.py"
  "$VENV/bin/pip" freeze > "$ROOT/results/pip-freeze-$(basename "$HERE").txt"  # provenance, outside the repository
}

prep() { "$PY" "$ANCH/common/prep_data.py"; }

train() {  # model [steps] [tag]
  local model=$1 steps=${2:-$(steps_for "$1")} tag=${3:-train}
  local dir="$ROOT/runs/onmt-$model"
  [ "$tag" = pilot ] && dir="$ROOT/runs/onmt-$model-pilot"
  rm -rf "$dir"; mkdir -p "$dir"
  RUN_DIR="$dir" STEPS=$steps LOG_FREQ=$(log_freq "$model") envsubst < "$HERE/$model.yaml.in" > "$dir/$tag.yaml"
  cp "$dir/$tag.yaml" "$ROOT/results/onmt_${model}.$tag.yaml"
  echo "[onmt] $tag $model: $steps updates ($(date))"
  /usr/bin/time -v -o "$dir/time_$tag.txt" "$VENV/bin/onmt_train" -config "$dir/$tag.yaml" > "$dir/$tag.out" 2>&1
  "$PY" "$ANCH/common/measure.py" train --toolkit onmt --log "$dir/$tag.out" \
     --time-v "$dir/time_$tag.txt" --batch-sents "$(batch_sents "$model")" > "$dir/${tag}_stats.json"
  cat "$dir/${tag}_stats.json"
}

decode() {  # model
  local model=$1
  local dir="$ROOT/runs/onmt-$model"
  local ckpt="$dir/model_step_$(steps_for "$model").pt"
  local spec name beam bs
  for spec in "greedy 1 $DEC_BATCH_DEFAULT" "beam5 5 $DEC_BATCH_DEFAULT" "greedy_bs1 1 1"; do
    read -r name beam bs <<< "$spec"
    echo "[onmt] decode $model $name (beam $beam, batch $bs sents) ($(date))"
    /usr/bin/time -v -o "$dir/time_dec_$name.txt" "$VENV/bin/onmt_translate" -model "$ckpt" \
       -src "$DATA/test_2016_flickr.sp.de" -output "$dir/hyp_$name.sp" -gpu -1 \
       -beam_size "$beam" -batch_size "$bs" -batch_type sents \
       -length_penalty wu -alpha $BEAM_ALPHA -max_length_ratio $MAX_LEN_RATIO -report_time \
       > "$dir/dec_$name.log" 2>&1
    "$PY" -c 'import sys, sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
with open(sys.argv[2]) as f, open(sys.argv[3], "w") as g:
    for l in f:
        g.write(sp.decode(l.split()) + "\n")' "$DATA/spm8k.model" "$dir/hyp_$name.sp" "$dir/hyp_$name.txt"
    "$PY" "$ANCH/common/measure.py" decode --toolkit onmt --hyp "$dir/hyp_$name.txt" \
       --ref "$DATA/test_2016_flickr.en" --spm "$DATA/spm8k.model" --toolkit-log "$dir/dec_$name.log" \
       --time-v "$dir/time_dec_$name.txt" > "$dir/dec_${name}_stats.json"
    cp "$dir/hyp_$name.txt" "$ROOT/results/onmt_${model}.hyp_$name.txt"
    grep -E '"(bleu|chrf|sents_per_s|tgt_tok_per_s|gen_time_s)"' "$dir/dec_${name}_stats.json" | tr -d '\n'; echo
  done
}

record() {  # model
  local model=$1
  local dir="$ROOT/runs/onmt-$model"
  "$PY" - "$model" "$dir/meta.json" "$(steps_for "$model")" "$(batch_sents "$model")" <<'PYEOF'
import json, sys, platform, datetime, os, torch, onmt, sacrebleu, sentencepiece
model, out, steps, bsz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
common = dict(vocab="joint SentencePiece unigram 8000 (char coverage 1.0) on train.de+train.en, text pre-encoded "
                    "with it (deterministic encode), outputs decoded with it; 8001 entries incl. specials",
              batch=f"{bsz} sentences per update (batch_type sents; bucket_size 29000 = whole corpus, "
                    "length-sorted batches shuffled)",
              budget_target_s=720, steps=steps, decoding_batch_default="30 sentences (OpenNMT-py default batch_size)",
              beam_length_penalty="wu alpha=1.0 (toolkit default would be 'avg')",
              max_output_length="min(250, 1.5 x longest source in batch + 5) (max_length_ratio 1.5; default 1.25)",
              greedy="beam_size 1 (BeamSearch with one beam = argmax; random_sampling_topk must stay 0: any non-zero value makes OpenNMT-py 3.5 use GreedySearch even for beam_size 5)",
              data_loader_workers="0 (toolkit default 2)")
if model == "rnn":
    settings = dict(arch="brnn GRU encoder 1 layer, enc_hid_size 512 split 256 per direction; GRU decoder 1 layer 512; "
                    "global_attention mlp (Bahdanau/additive); input_feed 1 (toolkit default); no bridge "
                    "(decoder init = concat of last fwd/bwd states); emb 256; no tying",
                    dropout="0.3 (embeddings and decoder output)", optimizer="Adam(0.9,0.999) lr 3e-4 constant",
                    clip_grad_norm=5.0, label_smoothing=0.0, loss_normalization="tokens",
                    init="uniform +-0.1 (toolkit default param_init)")
else:
    settings = dict(arch="Transformer 3+3 layers, d_model 256, 4 heads, FF 1024, pre-norm (toolkit's only option), ReLU, "
                    "sinusoidal positions (SinusoidalInterleaved), scaled embeddings, add_qkvbias+add_ffnbias true "
                    "(as Joey), share_decoder_embeddings true, self_attn_type scaled-dot-flash (default, SDPA)",
                    dropout="0.1 (+ attention_dropout 0.1)", label_smoothing=0.1, loss_normalization="tokens",
                    optimizer="Adam(0.9,0.98), noam: lr = 0.1732 * 256^-0.5 * min(step^-0.5, step*30^-1.5); peak 1.976e-3 at step 30",
                    clip_grad_norm=1.0, init="xavier_uniform (param_init_glorot)")
settings.update(common)
meta = dict(peer="onmt", model=model, date=datetime.datetime.now().isoformat(timespec="seconds"),
            versions=dict(opennmt_py=onmt.__version__, torch=torch.__version__, sentencepiece=sentencepiece.__version__,
                          sacrebleu=sacrebleu.__version__, python=platform.python_version()),
            machine=dict(cpu=cpu[0] if cpu else platform.processor(), nproc=os.cpu_count(),
                         torch_threads=torch.get_num_threads(), gpu=False),
            patches=["onmt/models/model_saver.py: torch.load(..., weights_only=False) in load_checkpoint "
                     "(torch>=2.6 default weights_only=True cannot unpickle the argparse.Namespace in the checkpoint)",
                     "installed with --no-deps (metadata pins torch<2.3), requirements installed by hand"],
            install_notes=["OpenNMT-py 3.5.1 --no-deps + its Requires-Dist by hand (torch kept at 2.13.0); sentencepiece 0.2.0 as for Joey",
                           "train log parsed from stdout (the -log_file copy stops after model building)",
                           "FutureWarnings about torch.cuda.amp silenced (PYTHONWARNINGS)"],
            budget_calibration="first main runs used steps from short pilots (rnn 500, transformer 212) and ended after 657 s / "
                               "532 s; re-run with steps = total_steps x 718 / loop_time of those runs (rnn 546, transformer 286)",
            settings=settings)
json.dump(meta, open(out, "w"), indent=1)
PYEOF
  "$PY" "$ANCH/common/measure.py" record --out "$ROOT/results/onmt_${model}.json" --meta "$dir/meta.json" \
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
