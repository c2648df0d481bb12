"""Shared data preparation for the Joey NMT / OpenNMT-py peer runs.

- copies raw Multi30k de-en (train/val/test_2016_flickr) to $DATA (default $TMPDIR/bench-peers/data)
- trains ONE joint SentencePiece unigram model (vocab 8000, character_coverage 1.0)
  on train.de + train.en
- writes a joint vocab file (all spm pieces except <unk>, <s>, </s>) in the formats
  each toolkit reads: vocab.joey.txt (one token per line) and vocab.onmt.txt (token<TAB>count)
- pre-encodes all splits into space-separated pieces (*.sp.de / *.sp.en) for OpenNMT-py
  (deterministic spm.encode, no sampling: identical to what Joey's tokenizer produces)
Run with any python that has sentencepiece installed.
"""
import os
import shutil
import collections
import sentencepiece as spm

SRC = os.environ.get("RAW", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "multi30k"))
DATA = os.environ.get("DATA", os.path.join(os.environ.get("TMPDIR", "/tmp"), "bench-peers", "data"))
os.makedirs(DATA, exist_ok=True)
splits = ["train", "val", "test_2016_flickr"]
for s in splits:
    for l in ("de", "en"):
        shutil.copy(os.path.join(SRC, f"{s}.{l}"), os.path.join(DATA, f"{s}.{l}"))

prefix = os.path.join(DATA, "spm8k")
if not os.path.exists(prefix + ".model"):
    spm.SentencePieceTrainer.train(
        input=",".join(os.path.join(DATA, f"train.{l}") for l in ("de", "en")),
        model_prefix=prefix, model_type="unigram", vocab_size=8000,
        character_coverage=1.0, input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=2, minloglevel=1)
sp = spm.SentencePieceProcessor(model_file=prefix + ".model")

counts = collections.Counter()
for s in splits:
    for l in ("de", "en"):
        with open(os.path.join(DATA, f"{s}.{l}")) as f, \
             open(os.path.join(DATA, f"{s}.sp.{l}"), "w") as g:
            for line in f:
                pieces = sp.encode(line.rstrip("\n"), out_type=str)
                if s == "train":
                    counts.update(pieces)
                g.write(" ".join(pieces) + "\n")

specials = {"<unk>", "<s>", "</s>"}
pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
          if sp.id_to_piece(i) not in specials]
with open(os.path.join(DATA, "vocab.joey.txt"), "w") as f:
    f.write("\n".join(pieces) + "\n")
with open(os.path.join(DATA, "vocab.onmt.txt"), "w") as f:
    for p in pieces:
        f.write(f"{p}\t{max(counts.get(p, 0), 1)}\n")
unused = sum(1 for p in pieces if counts.get(p, 0) == 0)
stats = {}
for s in splits:
    for l in ("de", "en"):
        n = [len(x.split()) for x in open(os.path.join(DATA, f"{s}.sp.{l}"))]
        stats[f"{s}.{l}"] = (len(n), sum(n), round(sum(n) / len(n), 2), max(n))
print("pieces in vocab files:", len(pieces), "never seen in train:", unused)
for k, v in stats.items():
    print(k, "lines=%d tokens=%d avg=%.2f max=%d" % v)
