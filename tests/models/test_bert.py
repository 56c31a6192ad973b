"""BERT-family encoders and sentence embeddings vs transformers and sentence-transformers."""

import io
import json
import shutil

import numpy as np
import pytest
import torch
import transformers

import ember
from ember.cli.main import main as cli_main
from ember.errors import ShapeError, UnsupportedError
from ember.models.bert import BertConfig, BertModel, checkpoint_weights
from ember.models.sentence import SentenceTransformer, default_model_dir, pool

TINY = dict(
    vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=72, max_position_embeddings=40, type_vocab_size=2, layer_norm_eps=1e-12,
)  # fmt: skip

# varied sentences: short, long (past the model's 256-token limit), empty, accents, CJK, digits
SENTENCES = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "   A cat is sleeping on the warm windowsill.   ",
    "Stock markets fell sharply after the central bank raised interest rates again.",
    "Machine learning models turn text into vectors that capture its meaning. " * 25,
    "Café crème, naïve façade — déjà vu!",
    "東京は日本の首都です。",
    "",
]


def _tiny(tmp_path, cls=transformers.BertModel, cfg_cls=transformers.BertConfig, **kw):
    torch.manual_seed(0)
    cfg = cfg_cls(**{**TINY, **kw})
    cfg._attn_implementation = "eager"
    ref = cls(cfg).eval()
    d = tmp_path / "tiny"
    ref.save_pretrained(d, safe_serialization=True)
    return ref, d


def _batch(rng, b=3, t=11, vocab=TINY["vocab_size"]):
    ids = rng.integers(1, vocab, (b, t))
    mask = np.ones((b, t), np.int64)
    mask[1, 7:] = 0
    mask[2, 2:] = 0
    ids[mask == 0] = 0
    types = np.zeros((b, t), np.int64)
    types[0, 5:] = 1
    return ids, mask, types


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_matches_transformers_packed_and_autograd_paths(tmp_path, act):
    ref, d = _tiny(tmp_path, hidden_act=act)
    model = BertModel.from_pretrained(d)
    assert model.config.hidden_act == act and model.config.layer_norm_eps == 1e-12
    ids, mask, types = _batch(np.random.default_rng(0))
    with torch.no_grad():
        want = ref(
            torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types)
        )
    real = mask.astype(bool)
    with ember.no_grad():  # packed inference path
        got = model(ids, attention_mask=mask, token_type_ids=types)
    np.testing.assert_allclose(
        got.last_hidden_state.numpy()[real], want.last_hidden_state.numpy()[real], atol=2e-5
    )
    assert (got.last_hidden_state.numpy()[~real] == 0).all()
    np.testing.assert_allclose(got.pooler_output.numpy(), want.pooler_output.numpy(), atol=2e-5)
    # the differentiable path (chosen when a parameter requires grad) agrees everywhere
    model.requires_grad_(True)
    out = model(
        ember.tensor(ids), attention_mask=ember.tensor(mask), token_type_ids=ember.tensor(types)
    )
    np.testing.assert_allclose(
        out.last_hidden_state.detach().numpy(), want.last_hidden_state.numpy(), atol=2e-5
    )
    np.testing.assert_allclose(out[1].detach().numpy(), want.pooler_output.numpy(), atol=2e-5)


def test_gradients_match_torch(tmp_path):
    ref, d = _tiny(tmp_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel.from_pretrained(d).train()
    model.requires_grad_(True)
    ids, mask, _ = _batch(np.random.default_rng(1), t=9)
    out = model(ids, attention_mask=mask)
    w = (
        np.random.default_rng(2).standard_normal(out.last_hidden_state.shape).astype(np.float32)
        * mask[..., None]
    )
    ((out.last_hidden_state * ember.tensor(w)).sum() + out.pooler_output.sum()).backward()
    ref.train()
    r = ref(torch.tensor(ids), attention_mask=torch.tensor(mask))
    ((r.last_hidden_state * torch.tensor(w)).sum() + r.pooler_output.sum()).backward()
    names = ["encoder.layer.0.attention.self.query.weight", "embeddings.word_embeddings.weight",
             "encoder.layer.1.intermediate.dense.bias", "embeddings.LayerNorm.weight"]  # fmt: skip
    for name in names:
        got = model.get_parameter(name).grad.numpy()
        np.testing.assert_allclose(got, ref.get_parameter(name).grad.numpy(), atol=1e-4, rtol=1e-3)


def test_task_checkpoint_prefix_and_no_pooler(tmp_path):
    ref, d = _tiny(tmp_path, cls=transformers.BertForMaskedLM)
    model = BertModel.from_pretrained(d)  # 'bert.' prefix stripped, 'cls.*' head dropped
    assert model.pooler is None
    ids, mask, _ = _batch(np.random.default_rng(3))
    with torch.no_grad():
        want = ref.bert(
            torch.tensor(ids), attention_mask=torch.tensor(mask)
        ).last_hidden_state.numpy()
    with ember.no_grad():
        got = model(ids, attention_mask=mask).last_hidden_state.numpy()
    np.testing.assert_allclose(got[mask == 1], want[mask == 1], atol=2e-5)
    legacy = {"bert.embeddings.LayerNorm.gamma": 1, "bert.embeddings.position_ids": 2, "cls.x": 3}
    assert checkpoint_weights(legacy) == {"embeddings.LayerNorm.weight": 1}


def test_roberta_positions(tmp_path):
    ref, d = _tiny(tmp_path, cls=transformers.RobertaModel, cfg_cls=transformers.RobertaConfig,
                   pad_token_id=1, max_position_embeddings=42, type_vocab_size=1)  # fmt: skip
    model = BertModel.from_pretrained(d)
    ids, mask, _ = _batch(np.random.default_rng(4))
    ids[ids == 1] = 5
    ids[mask == 0] = 1
    with torch.no_grad():
        want = ref(torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    with ember.no_grad():
        got = model(ids, attention_mask=mask).last_hidden_state.numpy()
    np.testing.assert_allclose(got[mask == 1], want[mask == 1], atol=2e-5)


def test_packed_equals_padded_and_errors(tmp_path):
    _, d = _tiny(tmp_path)
    model = BertModel.from_pretrained(d)
    ids, mask, types = _batch(np.random.default_rng(5))
    real = mask.astype(bool)
    cu = np.concatenate([[0], np.cumsum(mask.sum(1))])
    packed = model.forward_packed(ids[real], cu, types[real]).numpy()
    with ember.no_grad():
        padded = model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state.numpy()
    np.testing.assert_array_equal(packed, padded[real])
    with pytest.raises(ShapeError, match="max_position_embeddings"):
        model(np.ones((1, 41), np.int64))
    with pytest.raises(ShapeError, match="token ids"):
        model(np.array([[1, 500]]))
    with pytest.raises(ShapeError, match="cu_seqlens"):
        model.forward_packed(ids[real], cu[:-1])
    with pytest.raises(UnsupportedError, match="hidden_act"):
        BertConfig(hidden_act="tanh_magic")


# --- the pipeline ---------------------------------------------------------------------------


def test_pooling_modes_on_packed_rows():
    rng = np.random.default_rng(7)
    cu = np.array([0, 3, 4, 9])
    hidden = rng.standard_normal((9, 5)).astype(np.float32)
    segs = [hidden[a:b] for a, b in zip(cu[:-1], cu[1:])]
    out = pool(
        hidden, cu, ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
    )
    for i, s in enumerate(segs):
        w = np.arange(1, len(s) + 1)[:, None]
        want = np.concatenate([s[0], s.max(0), s.mean(0), s.sum(0) / np.sqrt(len(s)),
                               (s * w).sum(0) / w.sum(), s[-1]])  # fmt: skip
        np.testing.assert_allclose(out[i], want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def minilm():
    return SentenceTransformer()


@pytest.fixture(scope="module")
def st_minilm():
    from sentence_transformers import SentenceTransformer as ST

    return ST(str(default_model_dir()), device="cpu")


def _cos(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_minilm_matches_sentence_transformers(minilm, st_minilm):
    assert minilm.max_seq_length == 256 and minilm.pooling_modes == ("mean",) and minilm.normalize
    want = st_minilm.encode(SENTENCES, batch_size=3)
    got = minilm.encode(SENTENCES, batch_size=3)
    assert got.shape == (len(SENTENCES), 384) and got.dtype == np.float32
    assert _cos(got, want).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    single = minilm.encode(SENTENCES[3])
    assert single.shape == (384,) and _cos(single, st_minilm.encode(SENTENCES[3])) >= 0.99999
    # batch composition does not change results (no padding is ever computed)
    np.testing.assert_allclose(minilm.encode(SENTENCES, batch_size=1), got, atol=1e-6)
    np.testing.assert_allclose(minilm.encode(SENTENCES, batch_size=8), got, atol=1e-6)


def test_fixed_padding_gives_identical_embeddings(minilm):
    """tokenizer.json pads to 128: the padded grid with its mask gives the packed path's vectors."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    assert tok.padding["length"] == 128
    texts = SENTENCES[:4]
    enc = tok.encode_batch(texts)
    ids = np.array([e.ids for e in enc])
    mask = np.array([e.attention_mask for e in enc])
    assert ids.shape == (4, 128)
    with ember.no_grad():
        hidden = minilm.model(ids, attention_mask=mask).last_hidden_state.numpy()
        minilm.model.requires_grad_(True)  # the masked, padded, differentiable path
        try:
            slow = minilm.model(ids, attention_mask=mask).last_hidden_state.detach().numpy()
        finally:
            minilm.model.requires_grad_(False)
    for h in (hidden, slow):
        mean = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        mean /= np.linalg.norm(mean, axis=1, keepdims=True)
        np.testing.assert_allclose(mean, minilm.encode(texts), atol=2e-6)


def test_similarity_ranks_related_pairs_first(minilm):
    pairs = [
        ("A man is playing a guitar.", "Someone is strumming an acoustic guitar."),
        ("The weather is sunny and warm today.", "It is a bright, hot day outside."),
        ("How do I reset my password?", "I forgot my login password and need to change it."),
        ("The stock market crashed yesterday.", "Share prices fell sharply on Wall Street."),
    ]
    a = minilm.encode([p[0] for p in pairs])
    b = minilm.encode([p[1] for p in pairs])
    sim = minilm.similarity(a, b)
    related = np.diag(sim)
    unrelated = sim[~np.eye(len(pairs), dtype=bool)]
    assert related.min() > 0.5 and unrelated.max() < 0.3
    assert related.min() - unrelated.max() > 0.3


@pytest.mark.parametrize(
    "modes", [("cls", "max"), ("mean_sqrt_len_tokens", "weightedmean", "lasttoken")]
)
def test_pipeline_stages_match_sentence_transformers(tmp_path, modes):
    from sentence_transformers import SentenceTransformer as ST
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )

    src = default_model_dir()
    _, d = _tiny(tmp_path, vocab_size=30522, max_position_embeddings=64)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(src / f, d / f)
    tr = Transformer(str(d), max_seq_length=20)
    pooling, dense = Pooling(48, pooling_mode=modes), Dense(48 * len(modes), 16)
    ref = ST(modules=[tr, pooling, dense, Normalize()], device="cpu")
    out = tmp_path / "st"
    ref.save(str(out))
    model = SentenceTransformer(out)
    assert model.pooling_modes == modes and model.max_seq_length == 20 and len(model.dense) == 1
    texts = SENTENCES[:6]
    np.testing.assert_allclose(model.encode(texts), ref.encode(texts), atol=1e-5)
    raw_ref = ST(modules=[tr, pooling, dense], device="cpu").encode(texts)
    raw = model.encode(texts, normalize_embeddings=False)
    np.testing.assert_allclose(raw, raw_ref, atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1)


# --- the command line -----------------------------------------------------------------------


def test_cli_embed(tmp_path, capsys, monkeypatch, minilm):
    assert cli_main(["embed", "A cat sits.", "Stocks fell."]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    vecs = np.array([[float(x) for x in line.split()] for line in lines])
    np.testing.assert_allclose(vecs, minilm.encode(["A cat sits.", "Stocks fell."]), atol=1e-5)

    assert cli_main(["embed", "--summary", "one", "two"]) == 0
    out = capsys.readouterr().out
    assert "2 x 384" in out and "cosine similarity" in out

    monkeypatch.setattr("sys.stdin", io.StringIO("first line\n\nsecond line\n"))
    npy = tmp_path / "v.npy"
    assert (
        cli_main(["embed", "-", "--batch-size", "1", "--no-normalize", "--output", str(npy)]) == 0
    )
    saved = np.load(npy)
    assert saved.shape == (2, 384)
    np.testing.assert_allclose(
        saved, minilm.encode(["first line", "second line"], normalize_embeddings=False), atol=1e-6
    )

    js = tmp_path / "v.json"
    assert cli_main(["embed", "hello", "--output", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert doc["texts"] == ["hello"] and doc["dimension"] == 384 and doc["normalized"] is True
    assert cli_main(["embed", "hello", "--output", str(tmp_path / "v.txt")]) == 1
