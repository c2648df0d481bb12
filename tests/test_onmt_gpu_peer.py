"""benchmarks/peers/onmt_gpu.py (the OpenNMT-py GPU peer) without OpenNMT-py or a GPU: the report lines it
reads throughput from, the configuration it trains with and the time to BLEU it derives. The script itself
runs only where OpenNMT-py is installed (a GPU machine, or a CPU rehearsal)."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peers" / "onmt_gpu.py"


@pytest.fixture(scope="module")
def peer():
    # loaded from its file: benchmarks/peers on sys.path would make its onmt/ folder look like a package
    spec = importlib.util.spec_from_file_location("onmt_gpu_peer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report_line(second: int, step: int, tgt_rate: float) -> str:
    """A report line as OpenNMT-py 3.5.1's Statistics.output writes it."""
    body = ("Step %s; acc: %2.1f; ppl: %5.1f; xent: %2.1f; lr: %7.5f; sents: %7.0f; bsz: %4.0f/%4.0f/%2.0f; "
            "%3.0f/%3.0f tok/s; %6.0f sec;") % ("%2d/%5d" % (step, 1_000_000_000), 61.5, 8.2, 2.1, 0.00123, 14000,
                                                9000, 10000, 700, tgt_rate * 0.9, tgt_rate, second)
    return f"[2026-11-26 10:00:{second:02d},500 INFO] {body}"


def test_onmt_gpu_peer_takes_the_median_rate_of_the_report_intervals_after_the_first_15_percent(peer, tmp_path):
    log = tmp_path / "train.log"
    lines = ["[2026-11-26 09:59:59,000 INFO] * number of parameters: 9635137"]
    lines += [report_line(i, 20 * i, 1000.0 if i <= 3 else 50000.0 + i) for i in range(1, 21)]
    log.write_text("\n".join(lines) + "\n")
    loop_start = peer.datetime.strptime("2026-11-26 10:00:00", "%Y-%m-%d %H:%M:%S").timestamp()
    stats = peer.parse_log(log, loop_start)
    assert stats["params_logged"] == 9635137 and stats["n_report_intervals"] == 20
    assert stats["window"]["skipped_first"] == 3 and stats["window"]["first_step"] == 60
    assert stats["tgt_tok_per_s_median"] == 50012.0  # the slow start-up intervals left out
    assert stats["avg_tgt_tok_per_step"] == 10000.0 and stats["avg_sents_per_step"] == 700.0
    assert stats["reports"][0][:2] == [20, round(1.5 / 60, 3)]


def test_onmt_gpu_peer_trains_the_cpu_peers_transformer_with_token_batches_and_the_peak_lr_it_was_given(peer, tmp_path):
    args = SimpleNamespace(device="cuda", max_steps=0, eval_every_seconds=15.0, report_every=20, num_workers=2,
                           batch_tokens=12000, precision="fp16", peak_lr=2e-3, warmup=200)
    config = peer.config_yaml(args, tmp_path / "run", tmp_path / "data")
    for line in ("gpu_ranks: [0]", "model_dtype: fp16", "batch_type: tokens", "batch_size: 12000", "enc_layers: 3",
                 "hidden_size: 256", "transformer_ff: 1024", "share_decoder_embeddings: true", "warmup_steps: 200",
                 "save_checkpoint_steps: 1", "keep_checkpoint: -1", "vocab_size_multiple: 8"):
        assert line in config
    factor = float(config.split("learning_rate:")[1].split()[0])
    noam_peak = factor * 256 ** -0.5 * min(200 ** -0.5, 200 * 200 ** -1.5)  # OpenNMT-py's noam at step = warmup
    assert math.isclose(noam_peak, 2e-3, rel_tol=1e-5)
    cpu = peer.config_yaml(SimpleNamespace(**{**vars(args), "device": "cpu", "precision": "fp32", "max_steps": 30}),
                           tmp_path / "run", tmp_path / "data")
    assert "gpu_ranks: []" in cpu and "train_steps: 30" in cpu and "vocab_size_multiple: 1" in cpu


def test_onmt_gpu_peer_reports_the_first_checkpoint_minute_at_each_bleu_threshold(peer, tmp_path):
    record = peer.Record(tmp_path / "r.json", {})
    points = {step: {"step": step, "minute": minute, "minute_since_launch": minute + 0.3, "minute_excl_saves": minute,
                     "bleu": bleu, "status": "ok"}
              for step, minute, bleu in ((100, 0.5, 30.0), (200, 1.0, 38.4), (300, 1.5, 37.9), (400, 2.0, 39.2))}
    peer.finish_curve(record, points)
    ttb = record.data["time_to_bleu"]
    assert ttb["38"]["minute"] == 1.0 and ttb["38"]["step"] == 200
    assert ttb["39"]["minute"] == 2.0 and ttb["39"]["minute_since_launch"] == 2.3
    assert ttb["40"] is None
    assert [p["step"] for p in record.data["curve"]] == [100, 200, 300, 400]
