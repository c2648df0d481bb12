"""The README's promises about translating, checked as a user meets them: the Python example's
``Translation.alignment`` and ``seq2seq translate ... | head`` ending quietly."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from seq2seq import Translator

OLD_RNN = Path(__file__).parent / "data" / "pre-tiers" / "rnn.pt"
ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_python_example_gives_an_alignment_per_translation():
    for t in Translator.from_checkpoint(OLD_RNN, device="cpu").translate(["twenty-one", "four hundred and two"]):
        assert isinstance(t.text, str) and t.text and t.score < 0
        # (target pieces + EOS, source pieces + EOS), each row a distribution over the source
        assert t.alignment.shape == (len(t.tgt_pieces), len(t.src_pieces))
        np.testing.assert_allclose(t.alignment.sum(axis=-1), 1.0, atol=1e-5)
        record = t.alignment_record(0, include_eos=True)
        assert record.subword.shape == t.alignment.shape  # the same matrix the export writes, EOS kept
        np.testing.assert_allclose(record.subword, t.alignment, atol=1e-6)


def test_translate_into_head_is_not_an_error(tmp_path):
    """The reader closes the pipe after one line: translate stops with exit status 0 and no traceback
    (the output is larger than a pipe buffer, so later writes do hit the closed pipe)."""
    source = tmp_path / "in.txt"
    source.write_text("twenty-one thousand four hundred and two\n" * 3000, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq", "translate", "--checkpoint", str(OLD_RNN),
                             "--input", str(source), "--beam-size", "1", "--batch-size", "100", "--device", "cpu"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert first.strip() and "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err
