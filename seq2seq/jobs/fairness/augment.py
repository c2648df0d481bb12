"""Counterfactual data augmentation (Lu et al. 2020; Zmigrod et al. 2019): the training pairs with their
group terms swapped on both sides are added to the corpus, so that the model sees every gendered sentence
in both genders.

    seq2seq augment --data-dir multi30k --src en --tgt de --output-dir multi30k-cda
    seq2seq train --preset transformer --data-dir multi30k-cda --src en --tgt de ...

A pair is copied swapped only when both sides hold group terms (a swap of one side alone would teach a
mistranslation); validation and test files are copied unchanged, so scores stay comparable.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...errors import UserError
from ...io_utils import atomic_directory, read_parallel
from ...runtime import log
from .swaps import swapper_for


@dataclass
class AugmentJob:
    """What ``seq2seq augment`` takes."""

    data_dir: str  # directory of {split}.{lang} files
    src: str
    tgt: str
    output_dir: str  # a new directory: the augmented corpus
    swap_list_src: str | None = None  # the user's swap lists (None: the shipped one of the language)
    swap_list_tgt: str | None = None
    train_split: str = "train"
    force: bool = False


def augment(job: AugmentJob) -> dict:
    """Write the augmented corpus; returns (and writes as ``augment.json``) what was added."""
    root = Path(job.data_dir)
    if not root.is_dir():
        raise UserError(f"--data-dir {root}: no such directory")
    train = {lang: root / f"{job.train_split}.{lang}" for lang in (job.src, job.tgt)}
    source_swapper = swapper_for(job.src, job.swap_list_src, "--src")
    target_swapper = swapper_for(job.tgt, job.swap_list_tgt, "--tgt")
    sources, targets = read_parallel(train[job.src], train[job.tgt], "", "")
    extra_sources, extra_targets = [], []
    for source, target in zip(sources, targets):
        swapped_source, swapped_target = source_swapper.swap(source), target_swapper.swap(target)
        if swapped_source.terms and swapped_target.terms:
            extra_sources.append(swapped_source.text)
            extra_targets.append(swapped_target.text)
    summary = {"data_dir": str(root), "src": job.src, "tgt": job.tgt, "pairs": len(sources),
               "added": len(extra_sources), "lists": {job.src: job.swap_list_src or "shipped",
                                                      job.tgt: job.swap_list_tgt or "shipped"}}
    with atomic_directory(job.output_dir, force=job.force, flag="--output-dir") as out:
        for lang, lines, extra in ((job.src, sources, extra_sources), (job.tgt, targets, extra_targets)):
            (out / f"{job.train_split}.{lang}").write_text("".join(f"{line}\n" for line in lines + extra),
                                                          encoding="utf-8")
        for path in sorted(root.iterdir()):
            if path.suffix in (f".{job.src}", f".{job.tgt}") and path.stem != job.train_split and path.is_file():
                shutil.copyfile(path, out / path.name)
        (out / "augment.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log("augment", pairs=len(sources), added=len(extra_sources), output=job.output_dir)
    return summary
