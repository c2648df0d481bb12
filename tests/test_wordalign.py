"""``seq2seq wordalign``: eflomal's links of a parallel corpus, symmetrized, as Pharaoh lines. On a toy
corpus whose alignment is known by construction (each source word has one translation, the order is
reversed), the aligner finds it; symmetrization behaves as its definition says; bad files are named."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from seq2seq.alignment.links import parse_pharaoh
from seq2seq.cli import main
from seq2seq.alignment.links import symmetrized

pytest.importorskip("eflomal")

LEXICON = {f"s{i}": f"t{i}" for i in range(12)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path, list[set]]:
    """300 pairs: a random 2-6 word source, its word-by-word translation in reverse order; the gold
    links are (i, n - 1 - i)."""
    home = tmp_path_factory.mktemp("wordalign")
    rng = random.Random(3)
    sources, targets, gold = [], [], []
    for _ in range(300):
        words = rng.sample(sorted(LEXICON), rng.randint(2, 6))
        sources.append(" ".join(words))
        targets.append(" ".join(LEXICON[w] for w in reversed(words)))
        gold.append({(i, len(words) - 1 - i) for i in range(len(words))})
    (home / "src.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (home / "tgt.txt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    return home / "src.txt", home / "tgt.txt", gold


def test_the_aligner_finds_a_known_alignment(corpus, tmp_path):
    source, target, gold = corpus
    out = tmp_path / "links.talp"
    assert main(["wordalign", "--source", str(source), "--target", str(target), "--output", str(out)]) == 0
    found = [parse_pharaoh(line)[0] for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(found) == len(gold)
    correct = sum(len(f & g) for f, g in zip(found, gold))
    assert correct / sum(map(len, gold)) > 0.95  # recall
    assert correct / max(1, sum(map(len, found))) > 0.95  # precision


def test_symmetrization_follows_its_definition():
    forward, backward = {(0, 0), (1, 1), (2, 1)}, {(0, 0), (1, 1), (2, 2)}
    assert symmetrized(forward, backward, "intersection") == {(0, 0), (1, 1)}
    assert symmetrized(forward, backward, "forward") == forward
    assert symmetrized(forward, backward, "backward") == backward
    # grow-diag: (2, 1) and (2, 2) neighbour (1, 1) and cover the unaligned source word 2; the first one
    # grown (neighbours in the order right/left/up/down, then diagonals) makes the second redundant
    grown = symmetrized(forward, backward, "grow-diag-final-and")
    assert {(0, 0), (1, 1)} < grown <= forward | backward and any(i == 2 for i, _ in grown)


def test_bad_inputs_are_named(corpus, tmp_path, capsys):
    source, _, _ = corpus
    short = tmp_path / "short.txt"
    short.write_text("t1\n", encoding="utf-8")
    out = tmp_path / "out.talp"
    assert main(["wordalign", "--source", str(source), "--target", str(short), "--output", str(out)]) == 2
    assert f"--source {source} has 300 lines but --target {short} has 1" in capsys.readouterr().err
    assert main(["wordalign", "--source", str(tmp_path / "none"), "--target", str(short), "--output", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert not out.exists()
