"""Alignment library: word merge, EOS handling, layer choice, hard links, Pharaoh, AER, export."""
import json

import numpy as np
import pytest

from seq2seq.alignment.records import NO_EOS, AlignmentRecord, AlignmentWriter, EosPositions
from seq2seq.alignment.matrices import (
    aggregate, drop_eos, links_to_words, merge_to_words, word_spans, words_from_pieces,
)
from seq2seq.alignment.links import (
    agreement_matrix, alignment_error_rate, argmax_alignment, extract_links, grow_alignment, grow_diag_final,
    intersect_alignments, parse_pharaoh, read_pharaoh_file, soft_alignment, threshold_alignment, to_pharaoh,
    transpose_links,
)
from seq2seq.config import DEFAULT_SHARES, AlignConfig, link_share
from seq2seq.errors import UserError

SRC = ["▁Ein", "▁Hund", "e", "▁läuft"]
TGT = ["▁A", "▁do", "g", "▁runs"]


def random_attention(rng, layers, heads, tgt, src):
    a = rng.random((layers, heads, tgt, src)) + 0.01
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)  # (L, H, T, S), rows sum to 1


# ----------------------------------------------------------------------------- words


def test_word_spans_and_words():
    assert word_spans(SRC) == [(0, 1), (1, 3), (3, 4)]
    assert words_from_pieces(SRC) == ["Ein", "Hunde", "läuft"]
    # a leading piece without '▁' starts a word; specials are words of their own
    assert word_spans(["Hal", "lo", "▁Welt", "</s>"]) == [(0, 2), (2, 3), (3, 4)]
    assert words_from_pieces(["Hal", "lo", "</s>"]) == ["Hallo", "</s>"]
    assert word_spans([]) == [] and words_from_pieces([]) == []


def test_merge_to_words_hand_example():
    m = np.array([
        [0.7, 0.1, 0.1, 0.1],  # ▁A
        [0.1, 0.5, 0.3, 0.1],  # ▁do
        [0.3, 0.4, 0.2, 0.1],  # g
        [0.0, 0.1, 0.1, 0.8],  # ▁runs
    ])
    # source: sum columns ▁Hund+e -> ▁A [.7 .2 .1], ▁do [.1 .8 .1], g [.3 .6 .1], ▁runs [0 .2 .8]
    # target: average rows ▁do,g -> dog [(.1+.3)/2, (.8+.6)/2, (.1+.1)/2] = [.2 .7 .1]
    expected = np.array([[0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [0.0, 0.2, 0.8]])
    np.testing.assert_allclose(merge_to_words(m, SRC, TGT), expected, atol=1e-12)
    # leading dims are carried along
    stacked = merge_to_words(np.stack([m, m])[None], SRC, TGT)
    assert stacked.shape == (1, 2, 3, 3)
    np.testing.assert_allclose(stacked[0, 1], expected, atol=1e-12)
    with pytest.raises(ValueError):
        merge_to_words(m[:, :3], SRC, TGT)


def test_links_to_words():
    # piece links: e(2)->do(1), ▁Hund(1)->g(2), ▁läuft(3)->▁runs(3)
    assert links_to_words({(2, 1), (1, 2), (3, 3)}, SRC, TGT) == {(1, 1), (2, 2)}


def test_drop_eos_raw_and_renormalized():
    m = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.2, 0.2, 0.6]])  # last row/col = EOS
    raw = drop_eos(m)
    np.testing.assert_allclose(raw, [[0.5, 0.3], [0.1, 0.1]])
    np.testing.assert_allclose(drop_eos(m, renormalize=True), [[0.625, 0.375], [0.5, 0.5]])
    assert drop_eos(m, keep_src_eos=True).shape == (2, 3)
    assert drop_eos(m, keep_tgt_eos=True).shape == (3, 2)
    assert drop_eos(np.ones((1, 1))).shape == (0, 0)  # empty translation of an empty source


# ----------------------------------------------------------------------------- aggregate


def test_aggregate_layer_and_heads():
    a = random_attention(np.random.default_rng(0), 3, 2, 4, 5)
    np.testing.assert_allclose(aggregate(a), a[1].mean(0), rtol=1e-6)  # penultimate, mean heads
    np.testing.assert_allclose(aggregate(a, layer=0, heads=[1]), a[0, 1])
    np.testing.assert_allclose(aggregate(a, layer=-1, heads=1), a[2, 1])
    np.testing.assert_allclose(aggregate(a, layer="all"), a.mean((0, 1)), rtol=1e-6)
    np.testing.assert_allclose(aggregate(a).sum(-1), 1.0, rtol=1e-5)
    with pytest.raises(UserError, match="3 decoder layer"):
        aggregate(a, layer=3)
    with pytest.raises(UserError, match="2 head"):
        aggregate(a, heads=[2])


def test_aggregate_single_layer_falls_back():
    a = random_attention(np.random.default_rng(1), 1, 1, 3, 4)  # an RNN
    np.testing.assert_allclose(aggregate(a, layer=-2), a[0, 0])
    rec = AlignmentRecord.build(0, "s", "t", ["▁a", "▁b", "▁c"], ["▁x", "▁y"], a)
    assert rec.layer == -2 and rec.layer_used == 0


# ----------------------------------------------------------------------------- hard links


def test_argmax_threshold_intersection():
    m = np.array([[0.6, 0.3, 0.1], [0.1, 0.45, 0.45], [0.0, 0.0, 0.0]])
    assert argmax_alignment(m) == {(0, 0), (1, 1)}  # ties -> first; all-zero row -> no link
    assert threshold_alignment(m, 0.3) == {(0, 0), (1, 0), (1, 1), (2, 1)}
    assert argmax_alignment(np.zeros((2, 0))) == set()
    assert argmax_alignment(np.zeros((0, 3))) == set()
    # the backward model's matrix is (src rows, tgt cols): its argmax links come out (tgt, src)
    backward = transpose_links(argmax_alignment(m.T))  # m.T rows = our source words
    assert backward == {(0, 0), (1, 1), (2, 1)}
    assert intersect_alignments({(0, 0), (1, 1)}, backward) == {(0, 0), (1, 1)}


def test_grow_diag_final():
    forward = {(0, 0), (1, 1), (2, 2)}
    backward = {(0, 0), (1, 1), (2, 1), (3, 3)}
    # intersection {(0,0),(1,1)}; (2,2)/(2,1) neighbour (1,1) and cover unaligned src 2;
    # (3,3) is a neighbour of (2,2) whose words are both unaligned
    assert grow_diag_final(forward, backward) == {(0, 0), (1, 1), (2, 1), (2, 2), (3, 3)}


def test_agreement_is_the_geometric_mean_of_both_directions_probabilities():
    forward = np.array([[0.6, 0.2, 0.2],   # (target, source), rows need not sum to 1 (EOS dropped)
                        [0.1, 0.5, 0.2]])
    backward = np.array([[0.9, 0.1],       # (source, target): source 0 -> target 0
                         [0.5, 0.5],
                         [0.0, 0.8]])      # source 2 -> target 1 only
    agreed = agreement_matrix(forward, backward)
    f = forward / forward.sum(axis=1, keepdims=True)
    b = backward / backward.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(agreed, np.sqrt(f * b.T))
    assert agreed[0, 2] == 0  # the backward model gives source 2 nothing for target 0: no agreement
    assert agreed[0, 0] == pytest.approx(np.sqrt(0.6 * 0.9))
    # symmetric in the two directions: swapping the models transposes the matrix
    np.testing.assert_allclose(agreement_matrix(backward, forward), agreed.T)
    # one-hot rows that agree keep their links, those that disagree lose them
    one_hot = np.eye(3)
    assert argmax_alignment(agreement_matrix(one_hot, one_hot)) == {(0, 0), (1, 1), (2, 2)}
    assert extract_links(agreement_matrix(one_hot, one_hot[::-1]), "threshold", 0.5) == {(1, 1)}
    # an EOS row / column on one side only is cut away (models that split words differently)
    with_eos = np.pad(forward, ((0, 1), (0, 1)), constant_values=0.3)
    np.testing.assert_allclose(agreement_matrix(with_eos, backward), agreed)


def test_soft_links_need_their_share_of_the_row_and_of_the_column():
    m = np.array([[0.8, 0.2, 0.0],   # target 0: source 0
                  [0.7, 0.3, 0.0],   # target 1 also prefers source 0, but source 0 gives it less than target 0
                  [0.0, 0.1, 0.9]])
    # rows: (0,0) .8 (1,0) .2; (0,1) .7 (1,1) .3; (1,2) .1 (2,2) .9
    # columns: source 0 = .8/1.5, .7/1.5; source 1 = .2/.6, .3/.6, .1/.6; source 2 = .9/.9
    assert soft_alignment(m, 0.3) == {(0, 0), (0, 1), (1, 1), (2, 2)}
    assert soft_alignment(m, 0.5) == {(0, 0), (2, 2)}  # (0, 1): 0.47 of source 0's column
    assert soft_alignment(m, 0.3) == transpose_links(soft_alignment(m.T, 0.3))  # symmetric in the two readings
    assert soft_alignment(np.zeros((2, 3)), 0.3) == set()


def test_grow_links_symmetrize_the_row_and_the_column_argmax_of_one_matrix():
    m = np.array([[0.9, 0.1, 0.0],
                  [0.6, 0.4, 0.0],   # row argmax (0, 1); column argmax of source 1 is target 1: (1, 1)
                  [0.1, 0.0, 0.9]])
    rows, columns = argmax_alignment(m), transpose_links(argmax_alignment(m.T))
    assert rows == {(0, 0), (0, 1), (2, 2)} and columns == {(0, 0), (1, 1), (2, 2)}
    assert grow_alignment(m) == grow_diag_final(rows, columns) == {(0, 0), (0, 1), (1, 1), (2, 2)}
    for method in ("argmax", "threshold", "soft", "grow"):
        assert extract_links(m, method) <= {(i, j) for i in range(3) for j in range(3)}
    with pytest.raises(UserError, match="must be one of argmax, threshold, soft, grow"):
        extract_links(m, "max")


def test_grow_keeps_the_grown_links_with_their_share_of_the_row_and_of_the_column():
    m = np.array([[0.9, 0.1, 0.0],
                  [0.6, 0.4, 0.0],   # (0, 1): 0.6 of its row, 0.6 / 1.6 = 0.375 of source 0's column
                  [0.1, 0.0, 0.9]])  # (1, 1): 0.4 of its row, 0.4 / 0.5 = 0.8 of source 1's column
    grown = grow_alignment(m)
    assert grow_alignment(m, 0.38) == grown - {(0, 1)} == grown & soft_alignment(m, 0.38)
    assert grow_alignment(m, 0.0) == grown and grow_alignment(m, 0.85) == {(2, 2)}
    assert extract_links(m, "grow") == grow_alignment(m, DEFAULT_SHARES["grow"])  # unset: the method's default
    assert extract_links(m, "grow", 0.0) == grown
    assert extract_links(m, "threshold") == extract_links(m, "threshold", DEFAULT_SHARES["threshold"])


@pytest.mark.parametrize("method, threshold, expected", [
    ("argmax", None, None), ("argmax", 0.7, None), ("threshold", None, 0.3), ("soft", 0.5, 0.5), ("grow", None, 0.2),
    ("grow", 0, 0.0), ("grow", 1, 1.0)])
def test_link_share_resolves_each_method_default(method, threshold, expected):
    assert link_share(method, threshold) == expected


@pytest.mark.parametrize("method, threshold", [("threshold", 0.0), ("soft", 0.0), ("grow", -0.1), ("grow", 1.5)])
def test_a_share_out_of_range_is_a_named_error(method, threshold):
    with pytest.raises(UserError, match=f"--align-threshold must be in .* for --align-method {method}"):
        link_share(method, threshold)
    with pytest.raises(UserError, match="--align-threshold"):
        AlignConfig.from_flags("-2", "mean", method, threshold)


def test_tags_read_every_grown_link_unless_a_share_was_chosen():
    assert AlignConfig().for_markup().threshold == 0.0  # default method grow, no share given
    assert AlignConfig(threshold=0.3).for_markup().threshold == 0.3
    assert AlignConfig(method="soft").for_markup() == AlignConfig(method="soft")


# ----------------------------------------------------------------------------- Pharaoh


def test_pharaoh_round_trip():
    links = {(2, 0), (0, 0), (1, 3), (10, 2)}
    line = to_pharaoh(links)
    assert line == "0-0 1-3 2-0 10-2"
    sure, possible = parse_pharaoh(line)
    assert sure == links and possible == links
    line = to_pharaoh({(0, 0)}, possible={(1, 1), (0, 0)})
    assert line == "0-0 1?1"
    assert parse_pharaoh(line) == ({(0, 0)}, {(0, 0), (1, 1)})
    assert to_pharaoh(set()) == "" and parse_pharaoh("  \n") == (set(), set())


def test_pharaoh_possible_and_sure_markers():
    sure, possible = parse_pharaoh("0-1 2?3 4-5-P 6-7-S\n")
    assert sure == {(0, 1), (6, 7)}
    assert possible == {(0, 1), (2, 3), (4, 5), (6, 7)}  # possible includes sure


@pytest.mark.parametrize("bad", ["0-x", "1-2-3", "0:1", "-1-2", "1?", "1-2-Q"])
def test_pharaoh_bad_token(bad):
    with pytest.raises(UserError, match="bad alignment token") as err:
        parse_pharaoh(f"0-0 {bad}")
    assert f"0-0 {bad}" in str(err.value)


def test_read_pharaoh_file(tmp_path):
    path = tmp_path / "gold.talp"
    path.write_text("0-0 1?1\n\n2-2-S\n", encoding="utf-8")
    sure, possible = read_pharaoh_file(path)
    assert sure == [{(0, 0)}, set(), {(2, 2)}]
    assert possible == [{(0, 0), (1, 1)}, set(), {(2, 2)}]
    path.write_text("0-0\n1_1\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"gold.talp, line 2: .*'1_1'"):
        read_pharaoh_file(path)
    with pytest.raises(UserError, match="not found"):
        read_pharaoh_file(tmp_path / "missing.txt")


# ----------------------------------------------------------------------------- AER


def test_aer_hand_computed():
    # sentence 1: S = {0-0, 1-1}, P = S + {2-1}, A = {0-0, 2-1, 2-2}
    #   |A| = 3, |S| = 2, |A∩S| = 1 (0-0), |A∩P| = 2 (0-0, 2-1)
    #   precision 2/3, recall 1/2, AER = 1 - (1 + 2) / (3 + 2) = 0.4
    sure1, poss1 = {(0, 0), (1, 1)}, {(2, 1)}  # possible given without the sure links
    pred1 = {(0, 0), (2, 1), (2, 2)}
    one = alignment_error_rate([pred1], [sure1], [poss1])
    assert (one.precision, one.recall) == pytest.approx((2 / 3, 1 / 2))
    assert one.aer == pytest.approx(0.4)
    # sentence 2: S = P = A = {0-0}. Corpus sums: |A| = 4, |S| = 3, |A∩S| = 2, |A∩P| = 3
    #   precision 3/4, recall 2/3, AER = 1 - 5/7 = 2/7
    both = alignment_error_rate([pred1, {(0, 0)}], [sure1, {(0, 0)}], [poss1, {(0, 0)}])
    assert (both.precision, both.recall, both.aer) == pytest.approx((3 / 4, 2 / 3, 2 / 7))
    assert (both.predicted, both.sure, both.predicted_sure, both.predicted_possible) == (4, 3, 2, 3)
    assert both.sentences == 2


def test_aer_edge_cases():
    # no predicted link: precision |A∩P| / |A| is 0/0, undefined (None), not a perfect 1.0; no sure link:
    # recall |A∩S| / |S| likewise. AER keeps its formula: 1 - (0 + 0) / (0 + |S|) = 1 with sure links
    # (every one missed), and 0 with neither (nothing to get right, nothing got wrong)
    nothing = alignment_error_rate([set()], [set()], [set()])
    assert (nothing.precision, nothing.recall, nothing.aer) == (None, None, 0.0)
    missed = alignment_error_rate([set()], [{(0, 0)}])
    assert (missed.precision, missed.recall, missed.aer) == (None, 0.0, 1.0)
    # |A| = 2, |A∩P| = 1 (the possible 1-1), |S| = 0: precision 1/2, recall undefined, AER 1 - 1/2
    unsure = alignment_error_rate([{(0, 1), (1, 1)}], [set()], [{(1, 1)}])
    assert (unsure.precision, unsure.recall, unsure.aer) == (0.5, None, 0.5)
    perfect = alignment_error_rate([{(0, 0), (1, 1)}], [{(0, 0), (1, 1)}])
    assert perfect.aer == 0.0
    with pytest.raises(UserError, match="one line per sentence"):
        alignment_error_rate([set(), set()], [set()])


# ----------------------------------------------------------------------------- records/export


def test_record_sums_eos_and_padding():
    rng = np.random.default_rng(2)
    attn = random_attention(rng, 2, 3, 5, 5)  # 4 target pieces + EOS, 4 source pieces + EOS
    padded = np.zeros((2, 3, 7, 8), np.float32)
    padded[:, :, :5, :5] = attn
    rec = AlignmentRecord.build(0, "Ein Hunde läuft", "A dog runs", SRC, TGT + ["</s>"], padded,
                                AlignConfig(include_eos=True))
    assert rec.attention.shape == (2, 3, 5, 5)  # padding trimmed
    assert rec.src_pieces[-1] == "</s>" and rec.tgt_words == ["A", "dog", "runs", "</s>"]
    np.testing.assert_allclose(rec.subword.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(rec.words.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(rec.word_attention().sum(-1), 1.0, rtol=1e-5)
    assert rec.words.shape == (4, 4)
    plain = AlignmentRecord.build(0, "s", "t", SRC, TGT, padded, AlignConfig(method="argmax"))
    assert plain.subword.shape == (4, 4) and plain.words.shape == (3, 3)
    assert plain.word_attention().shape == (2, 3, 3, 3)
    assert "</s>" not in plain.src_words + plain.tgt_pieces
    # EOS never appears as an alignment point: indices stay below the word counts
    links = parse_pharaoh(plain.pharaoh_word)[0]
    assert len(links) == 3 and all(i < 3 and j < 3 for i, j in links)
    with pytest.raises(ValueError, match="does not cover"):
        AlignmentRecord.build(0, "s", "t", SRC + ["▁x"] * 4, TGT, attn)


def test_record_threshold_renormalizes():
    attn = np.zeros((1, 1, 2, 3), np.float32)  # 1 target word + EOS; 2 source words + EOS
    attn[0, 0, 0] = [0.2, 0.2, 0.6]  # most weight on EOS: renormalized 0.5/0.5 >= 0.4
    attn[0, 0, 1] = [0.0, 0.0, 1.0]
    rec = AlignmentRecord.build(0, "a b", "x", ["▁a", "▁b"], ["▁x"], attn,
                                AlignConfig(method="threshold", threshold=0.4))
    assert rec.pharaoh_word == "0-0 1-0"
    np.testing.assert_allclose(rec.words, [[0.2, 0.2]])  # exported weights stay raw


def test_record_reads_the_eos_positions_the_attention_has():
    """A hypothesis cut at max length has no target EOS row, an empty input neither row nor column (``NO_EOS``);
    read as if they had them (mutation: ``eos`` ignored), the attention would not cover the pieces + EOS."""
    rng = np.random.default_rng(5)
    cut = AlignmentRecord.build(0, "a b", "x y", ["▁a", "▁b"], ["▁x", "▁y"], random_attention(rng, 1, 1, 2, 3),
                                eos=EosPositions(tgt_eos=False))
    assert (cut.src_eos, cut.tgt_eos) == (True, False) and cut.attention.shape == (1, 1, 2, 3)
    assert cut.words.shape == (2, 2) and cut.word_attention().shape == (1, 1, 2, 2)
    empty = AlignmentRecord.build(1, "", "", [], [], np.zeros((2, 3, 0, 0), np.float32), eos=NO_EOS)
    assert empty.words.shape == empty.subword.shape == (0, 0) and empty.src_words == empty.tgt_words == []
    assert empty.pharaoh_word == empty.pharaoh_subword == "" and empty.layer_used == 0
    for eos in (EosPositions(), EosPositions(src_eos=False)):
        with pytest.raises(ValueError, match="does not cover"):
            AlignmentRecord.build(0, "a b", "x y", ["▁a", "▁b"], ["▁x", "▁y"], cut.attention, eos=eos)


def _write_two(writer, rng):
    writer.add(0, "Ein Hunde läuft", "A dog runs", SRC, TGT, random_attention(rng, 2, 4, 5, 5))
    # an empty translation: only the EOS row
    writer.add(7, "Ein Hunde läuft", "", SRC, [], random_attention(rng, 2, 4, 1, 5))


def test_writer_jsonl_and_npz(tmp_path):
    rng = np.random.default_rng(3)
    jsonl, npz = tmp_path / "out" / "align.jsonl", tmp_path / "out" / "align.npz"
    with AlignmentWriter(jsonl, npz, AlignConfig(heads=[0, 2], method="argmax")) as writer:
        _write_two(writer, rng)
    lines = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    assert [r["index"] for r in lines] == [0, 7]
    first, empty = lines
    assert first["src_words"] == ["Ein", "Hunde", "läuft"] and first["tgt_pieces"] == TGT
    assert np.array(first["word_matrix"]).shape == (3, 3) == tuple(first["word_shape"])
    assert np.array(first["subword_matrix"]).shape == (4, 4)
    assert first["attention_shape"] == [2, 4, 5, 5]
    assert first["layer"] == -2 and first["layer_used"] == 0 and first["heads"] == [0, 2]
    assert len(parse_pharaoh(first["pharaoh_subword"])[0]) == 4
    assert all(v == round(v, 4) for row in first["word_matrix"] for v in row)
    assert empty["word_matrix"] == [] and empty["word_shape"] == [0, 3]
    assert empty["pharaoh_word"] == ""
    with np.load(npz, allow_pickle=False) as arrays:
        assert arrays["s0_attention"].shape == (2, 4, 5, 5)
        assert arrays["s0_word_attention"].shape == (2, 4, 3, 3)
        assert arrays["s0_subword"].shape == (4, 4) and arrays["s0_words"].shape == (3, 3)
        assert list(arrays["s0_tgt_pieces"]) == TGT
        assert arrays["s7_attention"].shape == (2, 4, 1, 5)
        assert arrays["s7_words"].shape == (0, 3) and arrays["s7_tgt_pieces"].shape == (0,)
        meta = json.loads(str(arrays["meta"]))
    assert meta["sentences"] == 2 and meta["indices"] == [0, 7] and meta["heads"] == [0, 2]
    assert meta == {"layer": -2, "heads": [0, 2], "include_eos": False, "method": "argmax", "threshold": None,
                    "sentences": 2, "indices": [0, 7]}  # the writer's AlignConfig, whole (a key lost: caught)
    assert sorted(p.name for p in jsonl.parent.iterdir()) == ["align.jsonl", "align.npz"]


def test_writer_leaves_nothing_on_error(tmp_path):
    jsonl, npz = tmp_path / "align.jsonl", tmp_path / "align.npz"
    with pytest.raises(RuntimeError, match="interrupted"):
        with AlignmentWriter(jsonl, npz) as writer:
            _write_two(writer, np.random.default_rng(4))
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
