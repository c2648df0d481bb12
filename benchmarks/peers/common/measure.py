"""Measurement helpers shared by benchmarks/peers/joeynmt/run.sh and benchmarks/peers/onmt/run.sh.

Subcommands (all print JSON to stdout):
  train  --toolkit joey|onmt --log TRAIN_LOG --time-v TIME_V_FILE --batch-sents N [--warm-frac 0.15]
         steady-window training throughput + loop time + params + peak RSS
  decode --hyp DETOK_HYP --ref REF --spm SPM_MODEL --toolkit-log LOG --time-v TIME_V_FILE --toolkit joey|onmt
         BLEU / chrF (sacrebleu defaults), decode speed
  record --out FILE.json --meta META.json --train TRAIN.json --decode NAME=DEC.json ...
         merge everything into one per-(peer x model) record

Definitions (identical for both toolkits):
  tgt tokens   = non-pad target tokens incl. EOS, as counted by the toolkit's own training counters
                 (Joey: batch.ntokens, OpenNMT-py: n_words)
  src tokens   = source subword tokens (OpenNMT-py: its n_src_words counter; Joey has no source counter,
                 so src = sentences * mean source length of train.sp.de; batches are random samples)
  steady window = log intervals whose last step is > warm_frac * total steps (Joey: intervals that
                 straddle an epoch boundary are dropped, because Joey resets its counters there)
  decode tokens = SentencePiece pieces of the detokenized hypotheses (no EOS), re-encoded with the
                 shared spm model, so both toolkits are counted the same way
  decode time  = the toolkit's own generation timer (Joey: 'Generation took', OpenNMT-py: 'Total
                 translation time'); process wall time (incl. python start-up and model load) also given
"""
import argparse
import datetime
import json
import os
import re

TS = r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3})"


def ts(line):
    m = re.search(TS, line)
    if not m:
        return None
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    return t.timestamp() + int(m.group(2)) / 1000.0


def time_v(path):
    out = {}
    if not path:
        return out
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("Maximum resident set size (kbytes):"):
            out["peak_rss_mb"] = round(int(line.split(":")[1]) / 1024.0, 1)
        elif line.startswith("Elapsed (wall clock) time"):
            v = line.split("):", 1)[1].strip() if "):" in line else line.rsplit(" ", 1)[1]
            parts = [float(x) for x in v.split(":")]
            sec = 0.0
            for p in parts:
                sec = sec * 60 + p
            out["process_wall_s"] = round(sec, 2)
        elif line.startswith("User time (seconds):"):
            out["user_s"] = float(line.split(":")[1])
        elif line.startswith("System time (seconds):"):
            out["sys_s"] = float(line.split(":")[1])
        elif line.startswith("Percent of CPU this job got:"):
            out["cpu_percent"] = line.split(":")[1].strip()
    return out


def mean_src_len(path):
    n = t = 0
    for line in open(path):
        n += 1
        t += len(line.split())
    return t / n


def train_joey(log, batch_sents, warm_frac, src_path):
    lines = open(log, errors="replace").read().splitlines()
    step_re = re.compile(r"Epoch\s+(\d+), Step:\s+(\d+), Batch Loss:\s+([\d.]+), Batch Acc: ([\d.]+), "
                         r"Tokens per Sec:\s+(\d+), Lr: ([\d.e-]+)")
    params = None
    final_step = 0
    loop_start = loop_end = None
    epoch_starts = []
    intervals = []
    last_t = None
    for line in lines:
        if "Total params:" in line:
            params = int(line.rsplit(":", 1)[1])
        if re.search(r"joeynmt.training - EPOCH \d+", line):
            t = ts(line)
            epoch_starts.append(t)
            if loop_start is None:
                loop_start = t
                last_t = t
        m = step_re.search(line)
        if m:
            t = ts(line)
            intervals.append(dict(step=int(m.group(2)), t0=last_t, t1=t, rate=float(m.group(5)),
                                  loss=float(m.group(3)), lr=float(m.group(6))))
            last_t = t
            loop_end = t
        if "Training ended" in line or "Interrupt at epoch" in line:
            loop_end = ts(line)
        m2 = re.search(r"Checkpoint saved in .*?(\d+)\.ckpt", line)
        if m2:
            final_step = int(m2.group(1))
    total_steps = intervals[-1]["step"] if intervals else 0
    log_freq = intervals[0]["step"] if intervals else 0
    last_logged = total_steps
    total_steps = max(total_steps, final_step)
    msl = mean_src_len(src_path)
    win = []
    for iv in intervals:
        straddles = any(iv["t0"] < e <= iv["t1"] for e in epoch_starts[1:])
        if iv["step"] > warm_frac * total_steps and not straddles:
            win.append(iv)
    sec = sum(iv["t1"] - iv["t0"] for iv in win)
    tgt = sum(iv["rate"] * (iv["t1"] - iv["t0"]) for iv in win)
    sents = len(win) * log_freq * batch_sents
    src = sents * msl
    return dict(
        params=params, total_steps=total_steps, last_logged_step=last_logged, loop_time_s=round(loop_end - loop_start, 1),
        final_logged_loss=intervals[-1]["loss"] if intervals else None,
        window=dict(first_step=win[0]["step"] - log_freq if win else None,
                    last_step=win[-1]["step"] if win else None, seconds=round(sec, 1),
                    n_intervals=len(win)),
        tgt_tok_per_s=round(tgt / sec, 1), src_tok_per_s_est=round(src / sec, 1),
        src_tgt_tok_per_s=round((src + tgt) / sec, 1), sents_per_s=round(sents / sec, 2),
        steps_per_s=round(len(win) * log_freq / sec, 4),
        avg_tgt_tok_per_step=round(tgt / (len(win) * log_freq), 1),
        note="src tokens estimated as sentences x mean train source length (%.3f)" % msl)


def train_onmt(log, batch_sents, warm_frac, src_path):
    lines = open(log, errors="replace").read().splitlines()
    step_re = re.compile(r"Step\s+(\d+)/\s*(\d+); acc:\s+([\d.]+); ppl:\s+([\d.]+); xent:\s+([\d.]+); "
                         r"lr:\s+([\d.e-]+); sents:\s+(\d+); bsz:\s+(\d+)/\s*(\d+)/\s*(\d+); "
                         r"\s*([\d.]+)/\s*([\d.]+) tok/s;\s+(\d+) sec;")
    params = None
    final_step = 0
    loop_start = loop_end = None
    intervals = []
    prev = 0
    for line in lines:
        if "* number of parameters:" in line:
            params = int(line.rsplit(":", 1)[1])
        if "Start training loop" in line:
            loop_start = ts(line)
        m = step_re.search(line)
        if m:
            step = int(m.group(1))
            nb = step - prev
            prev = step
            src_tok = int(m.group(8)) * nb
            tgt_tok = int(m.group(9)) * nb
            rate_tgt = float(m.group(12))
            intervals.append(dict(step=step, nb=nb, sents=int(m.group(7)), src=src_tok, tgt=tgt_tok,
                                  sec=tgt_tok / rate_tgt if rate_tgt > 0 else 0.0,
                                  xent=float(m.group(5)), lr=float(m.group(6))))
            loop_end = ts(line)
        m2 = re.search(r"Saving checkpoint .*model_step_(\d+)\.pt", line)
        if m2:
            final_step = int(m2.group(1))
            loop_end = ts(line)
    total_steps = intervals[-1]["step"] if intervals else 0
    last_logged = total_steps
    total_steps = max(total_steps, final_step)
    win = [iv for iv in intervals if iv["step"] > warm_frac * total_steps]
    sec = sum(iv["sec"] for iv in win)
    tgt = sum(iv["tgt"] for iv in win)
    src = sum(iv["src"] for iv in win)
    sents = sum(iv["sents"] for iv in win)
    nsteps = sum(iv["nb"] for iv in win)
    return dict(
        params=params, total_steps=total_steps, last_logged_step=last_logged, loop_time_s=round(loop_end - loop_start, 1),
        final_logged_loss=intervals[-1]["xent"] if intervals else None,
        window=dict(first_step=win[0]["step"] - win[0]["nb"] if win else None,
                    last_step=win[-1]["step"] if win else None, seconds=round(sec, 1),
                    n_intervals=len(win)),
        tgt_tok_per_s=round(tgt / sec, 1), src_tok_per_s=round(src / sec, 1),
        src_tgt_tok_per_s=round((src + tgt) / sec, 1), sents_per_s=round(sents / sec, 2),
        steps_per_s=round(nsteps / sec, 4), avg_tgt_tok_per_step=round(tgt / nsteps, 1),
        note="all counts from OpenNMT-py's own per-interval counters (bsz averages x steps)")


def cmd_train(a):
    fn = train_joey if a.toolkit == "joey" else train_onmt
    r = fn(a.log, a.batch_sents, a.warm_frac, a.src)
    r.update(time_v(a.time_v))
    r["warm_frac"] = a.warm_frac
    print(json.dumps(r, indent=1))


def cmd_decode(a):
    import sacrebleu
    import sentencepiece as spm
    hyps = [l.rstrip("\n") for l in open(a.hyp, encoding="utf-8")]
    refs = [l.rstrip("\n") for l in open(a.ref, encoding="utf-8")]
    assert len(hyps) == len(refs), (len(hyps), len(refs))
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    sp = spm.SentencePieceProcessor(model_file=a.spm)
    ntok = sum(len(sp.encode(h, out_type=str)) for h in hyps)
    log = open(a.toolkit_log, errors="replace").read()
    if a.toolkit == "joey":
        gen = float(re.findall(r"Generation took ([\d.]+)\[sec\]", log)[-1])
    else:
        gen = float(re.findall(r"Total translation time \(s\): ([\d.]+)", log)[-1])
    r = dict(n_sents=len(hyps), bleu=round(b.score, 2), chrf=round(c.score, 2),
             bleu_str=str(b), chrf_str=str(c),
             bleu_signature=str(bleu.get_signature()), chrf_signature=str(c and chrf.get_signature()),
             hyp_tokens=ntok, ref_len_ratio=round(b.sys_len / b.ref_len, 3),
             empty_hyps=sum(1 for h in hyps if not h.strip()),
             gen_time_s=round(gen, 2), sents_per_s=round(len(hyps) / gen, 2),
             tgt_tok_per_s=round(ntok / gen, 1))
    tv = time_v(a.time_v)
    r.update({k: tv[k] for k in ("peak_rss_mb", "process_wall_s") if k in tv})
    if "process_wall_s" in r:
        r["sents_per_s_wall"] = round(len(hyps) / r["process_wall_s"], 2)
    print(json.dumps(r, indent=1))


def cmd_record(a):
    rec = json.load(open(a.meta))
    rec["train"] = json.load(open(a.train))
    rec["decode"] = {}
    for kv in a.decode:
        name, path = kv.split("=", 1)
        rec["decode"][name] = json.load(open(path))
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    print(a.out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--toolkit", required=True, choices=["joey", "onmt"])
    t.add_argument("--log", required=True)
    t.add_argument("--time-v", default=None)
    t.add_argument("--batch-sents", type=int, required=True)
    t.add_argument("--warm-frac", type=float, default=0.15)
    t.add_argument("--src", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "bench-peers", "data", "train.sp.de"))
    d = sub.add_parser("decode")
    d.add_argument("--toolkit", required=True, choices=["joey", "onmt"])
    d.add_argument("--hyp", required=True)
    d.add_argument("--ref", required=True)
    d.add_argument("--spm", required=True)
    d.add_argument("--toolkit-log", required=True)
    d.add_argument("--time-v", default=None)
    r = sub.add_parser("record")
    r.add_argument("--out", required=True)
    r.add_argument("--meta", required=True)
    r.add_argument("--train", required=True)
    r.add_argument("--decode", nargs="*", default=[])
    a = ap.parse_args()
    {"train": cmd_train, "decode": cmd_decode, "record": cmd_record}[a.cmd](a)


if __name__ == "__main__":
    main()
