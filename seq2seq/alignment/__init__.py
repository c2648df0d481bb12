"""Attention -> alignments, shared by every package that reads them (decoding, attribution, serving,
the jobs): ``matrices`` (layer and head choice, piece-to-word merge, EOS), ``links`` (hard links,
symmetrization, Pharaoh, AER), ``records`` (the per-sentence record, its JSONL / NPZ export and
schema), ``plotting`` (matplotlib heatmaps and curves) and ``viewer`` (the self-contained HTML viewer).

Conventions
-----------
* A model returns one attention array per sentence of shape ``(layers, heads, tgt_len, src_len)``:
  rows are the produced target subwords plus a final EOS row, columns the source subwords plus a
  final source EOS column. RNNs have layers = heads = 1.
* Links are ``(src_index, tgt_index)`` pairs, 0-based, as in Pharaoh files (``"i-j"``).
* Matrices are ``(..., tgt, src)``: one row per target token, a distribution over source tokens.
"""
