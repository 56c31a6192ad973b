"""The Ray Data callables called directly (numpy batches in, columns added), and the Serve
application builder's options, without a cluster."""

from __future__ import annotations

import numpy as np
import pytest

from ember.errors import EmberError
from ember.integrations.ray import Classifier, Embedder, Generator
from ember.models.hub import DEFAULT_FILE, DEFAULT_PACKAGE, package_dir


def _have_llm() -> bool:
    d = package_dir(DEFAULT_PACKAGE)
    return d is not None and (d / DEFAULT_FILE).is_file()


def test_embedder_adds_embeddings_equal_to_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    from ember.models.sentence import default_model_dir

    texts = np.array(["A cat sits on the mat.", "Dogs run.", "A quiet hill at midnight."])
    out = Embedder(batch_size=2)({"text": texts, "id": np.arange(3)})
    assert set(out) == {"text", "id", "embedding"} and out["embedding"].dtype == np.float32
    assert out["embedding"].shape == (3, 384)
    ref = st.SentenceTransformer(str(default_model_dir()), device="cpu").encode(list(texts))
    np.testing.assert_allclose(out["embedding"], ref, atol=1e-5)
    empty = Embedder()({"text": np.array([], dtype=object)})
    assert empty["embedding"].shape == (0, 384)


def test_embedder_refuses_bad_batches():
    e = Embedder(column="sentence")
    with pytest.raises(EmberError, match="no column 'sentence'.*columns: text"):
        e({"text": np.array(["a"])})
    with pytest.raises(EmberError, match="row 1 is int"):
        e({"sentence": np.array(["a", 3], dtype=object)})
    with pytest.raises(EmberError, match="numpy batches"):
        e([{"sentence": "a"}])
    with pytest.raises(EmberError, match="batch_size"):
        Embedder(batch_size=0)


def test_classifier_matches_image_classifier():
    pytest.importorskip("PIL")
    from ember.models.vision.pipeline import ImageClassifier

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 64, 80, 3), dtype=np.uint8)
    out = Classifier(top=2)({"image": images})
    ref = ImageClassifier.load()(list(images), top=2)
    assert out["class_index"].shape == (3, 2) and out["probability"].dtype == np.float32
    for i, row in enumerate(ref):
        assert list(out["class_index"][i]) == [c for c, _, _ in row]
        assert list(out["label"][i]) == [lab for _, lab, _ in row]
        np.testing.assert_allclose(out["probability"][i], [p for _, _, p in row], rtol=1e-6)
    top1 = Classifier()({"image": images[:1]})
    assert top1["class_index"].shape == (1,) and top1["class_index"][0] == ref[0][0][0]


@pytest.mark.skipif(not _have_llm(), reason="the bundled SmolLM2 is not installed")
def test_generator_matches_ember_generate():
    from ember.generation.generate import generate

    g = Generator(max_tokens=5)
    prompts = np.array(["Once upon a time", "The capital of France is"], dtype=object)
    out = g({"prompt": prompts})
    ref = generate(g.model, g.tokenizer, list(prompts), 5)
    assert list(out["generated_text"]) == ref and all(ref)
    chat = Generator(max_tokens=3, chat=True)({"prompt": prompts[:1]})
    assert isinstance(chat["generated_text"][0], str)
    with pytest.raises(EmberError, match="max_tokens"):
        Generator(max_tokens=0)


def test_app_builder_passes_autoscaling_and_max_ongoing_requests_through():
    pytest.importorskip("ray.serve")
    from ember.integrations import _ray_serve as ray_serve
    from ember.integrations.ray import EmberAppArgs, build_app

    args = EmberAppArgs(
        **{"min_replicas": "1", "max_replicas": "4", "max_ongoing_requests": "12", "num_cpus": "2"}
    )
    opts = ray_serve.deployment_options(args)
    assert opts["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4}
    assert opts["max_ongoing_requests"] == 12 and opts["ray_actor_options"] == {"num_cpus": 2.0}
    assert "num_replicas" not in opts
    assert ray_serve.deployment_options(EmberAppArgs(num_replicas=3))["num_replicas"] == 3
    # an LLM replica defaults to room for a full engine batch plus as many queued
    assert ray_serve.deployment_options(EmberAppArgs(max_running=5))["max_ongoing_requests"] == 10
    raw = EmberAppArgs(autoscaling_config='{"min_replicas": 2, "max_replicas": 3}', api_keys="a,b")
    assert ray_serve.deployment_options(raw)["autoscaling_config"]["max_replicas"] == 3
    assert raw.api_keys == ["a", "b"]
    with pytest.raises(EmberError, match="not both"):
        ray_serve.deployment_options(EmberAppArgs(num_replicas=2, max_replicas=3))
    with pytest.raises(EmberError, match="num_cpus"):
        ray_serve.deployment_options(EmberAppArgs(num_cpus=0))
    with pytest.raises(EmberError, match="task"):
        build_app(task="translate")
    if _have_llm():
        application = build_app({"num_replicas": 2, "max_ongoing_requests": 7})
        backend = application._bound_deployment.init_args[0]._bound_deployment
        assert backend.name == "EmberServer" and backend.num_replicas == 2
        assert backend.max_ongoing_requests == 7
        assert backend.ray_actor_options["num_cpus"] == 1.0


def test_detect_task(tmp_path):
    pytest.importorskip("ray.serve")
    from ember.integrations._ray_serve import detect_task
    from ember.models.sentence import default_model_dir

    assert detect_task(str(default_model_dir())) == "embed"
    assert detect_task("efficientnet_lite0") == "classify"
    assert detect_task(None) == "generate" and detect_task(str(tmp_path)) == "generate"
