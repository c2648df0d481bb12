"""Attribution of a sentence pair given as text, for ``seq2seq serve``: the methods a model allows and what each
costs, and one method's matrices in the layout of the alignment viewer (``alignment.viewer``).

The server (``seq2seq.serve``) does not import this package (the tier-4 packages are independent of one another,
docs/design.md): ``seq2seq serve`` builds an ``Explainer`` from its flags and hands it to the server
(``ServeSettings.explain``), which calls it in its worker thread, where the model runs. The pair is the one the
page shows, a source and the translation the model gave it; it is teacher-forced as text (``attribute_translation``
on the re-tokenized pair), so the matrices carry their own labels: they are those of the translation's attention
whenever the translation re-tokenizes to the same pieces, which SentencePiece almost always does.
"""
from __future__ import annotations

import importlib.util

from ..alignment.viewer import attribution_view
from ..config import AlignConfig, AttributionConfig
from ..decoding.ensemble import EnsembleModel
from ..decoding.translation import Translation
from ..errors import UserError
from ..nn.quantize import is_quantized
from ..tokenizer import EOS_ID
from .attribute import attribute_translation
from .base import CONTRAST_METHODS, GRADIENT_METHODS, METHODS
from .perturbation import min_samples

#: the methods whose cost grows with a setting (integration steps, samples): run on request only (a button)
SLOW = ("integrated-gradients", "lime", "kernel-shap")
#: the methods that go through Captum (``pip install 'seq2seq[explain]'``)
CAPTUM = ("lime", "kernel-shap")


def cost(method: str, config: AttributionConfig) -> str:
    """What ``method`` costs for one sentence pair, in model passes (serve's page shows it beside the method)."""
    if method in ("gradient", "grad-attention"):
        return "1 forward and backward pass"
    if method == "integrated-gradients":
        return f"{config.ig_steps} forward and backward passes (--ig-steps)"
    if method == "occlusion":
        return "1 forward pass per source subword"
    return f"{config.samples} forward passes (--attribution-samples)"


class Explainer:
    """The attribution a server offers: ``config.methods`` (the allowed ones, in the order shown), with the
    settings of ``config`` (integration steps, samples, seed)."""

    def __init__(self, config: AttributionConfig) -> None:
        unknown = [method for method in config.methods if method not in METHODS]
        if unknown:
            raise UserError(f"unknown attribution method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
        if config.ig_steps < 1:
            raise UserError(f"--ig-steps must be >= 1, got {config.ig_steps}")
        if config.samples < min_samples(1):
            raise UserError(f"--attribution-samples must be >= {min_samples(1)} (2 (words + 1) for a one-word "
                            f"source), got {config.samples}")
        self.config = config

    def methods(self, model) -> list[dict]:
        """The allowed methods ``model`` can run, each ``{"method", "cost", "slow", "contrast"}`` (``contrast``: it
        answers "why this word rather than that one"). The gradient methods need one model with gradients (not an
        ensemble, not int8); LIME and KernelSHAP need Captum installed."""
        out = []
        for method in dict.fromkeys(self.config.methods):
            if method in GRADIENT_METHODS and (isinstance(model, EnsembleModel) or is_quantized(model)):
                continue
            if method in CAPTUM and importlib.util.find_spec("captum") is None:
                continue
            out.append({"method": method, "cost": cost(method, self.config), "slow": method in SLOW,
                        "contrast": method in CONTRAST_METHODS})
        return out

    def __call__(self, translator, align: AlignConfig, source: str, target: str, method: str,
                 contrast: str | None = None) -> dict:
        """``method``'s attribution of ``target`` as the translation of ``source`` by ``translator``'s model, read
        with ``align`` (grad-attention's layer and heads, the links' options); ``contrast``: explain it against
        this alternative translation. The viewer's view of it with the labels it has: ``{"method", "contrast",
        "view"}``, the view with its own ``levels``. A UserError for a pair it cannot explain."""
        if not source.strip() or not target.strip():
            raise UserError("nothing to explain: the source and the translation must both have words")
        if contrast is not None and not contrast.strip():
            contrast = None
        tokenizer = translator.tokenizer
        src_ids = tokenizer.encode(source.strip())[: translator.max_input_tokens] + [EOS_ID]
        tgt_ids = tokenizer.encode(target.strip())
        pair = Translation(source=source, text=target, tokens=tgt_ids, score=0.0, log_prob=0.0,
                           src_pieces=tokenizer.pieces(src_ids), tgt_pieces=tokenizer.pieces(tgt_ids + [EOS_ID]),
                           src_tokens=src_ids)
        attribution = attribute_translation(translator, pair, method, self.config, align, contrast=contrast)
        record = attribution.record_for(pair, 0, **align.link_options())
        view = attribution_view(method, attribution.to_json(record))
        view["levels"] = {"word": {"src": record.src_words, "tgt": record.tgt_words},
                          "subword": {"src": record.src_pieces, "tgt": record.tgt_pieces}}
        return {"method": method, "contrast": None if contrast is None else contrast.strip(), "view": view}
