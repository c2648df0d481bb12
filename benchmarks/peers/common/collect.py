"""Merge results/{joeynmt,onmt}_{rnn,transformer}.json (under $ANCHORS_TMP) into results.json and print a
markdown table (for docs/benchmarks.md). Usage: python collect.py [ANCHORS_DIR]"""
import json
import os
import sys
anch = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
recs = []
for peer in ("joeynmt", "onmt"):
    for model in ("rnn", "transformer"):
        p = os.path.join(anch, "results", f"{peer}_{model}.json")
        if os.path.exists(p):
            recs.append(json.load(open(p)))
json.dump(recs, open(os.path.join(anch, "results.json"), "w"), indent=1)

def g(d, *ks, default="-"):
    for k in ks:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d

hdr = ("| peer | model | params | steps (loop s) | train tgt tok/s | train src+tgt tok/s | sents/s | peak RSS train (MB) "
       "| BLEU greedy | BLEU beam5 | chrF greedy | chrF beam5 | greedy sent/s (tok/s) | beam5 sent/s (tok/s) | greedy bs1 sent/s (tok/s) |")
print(hdr)
print("|" + "---|" * hdr.count("|")[:-1] if False else "|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|")
for r in recs:
    t, d = r["train"], r["decode"]
    def dec(n):
        return f'{g(d, n, "sents_per_s")} ({g(d, n, "tgt_tok_per_s")})'
    print(f'| {r["peer"]} | {r["model"]} | {t["params"]:,} | {t["total_steps"]} ({t["loop_time_s"]}) | {t["tgt_tok_per_s"]} '
          f'| {t["src_tgt_tok_per_s"]} | {t["sents_per_s"]} | {t.get("peak_rss_mb", "-")} '
          f'| {g(d, "greedy", "bleu")} | {g(d, "beam5", "bleu")} | {g(d, "greedy", "chrf")} | {g(d, "beam5", "chrf")} '
          f'| {dec("greedy")} | {dec("beam5")} | {dec("greedy_bs1")} |')
