"""ember models on Ray: Ray Serve deployments (online) and Ray Data callables (batch).

Ray Serve (the ``ray`` extra, ``ray[serve]``)::

    serve run ember.integrations.ray:app model=model.gguf num_replicas=2
    ember serve --ray --replicas 2 --num-cpus-per-replica 1     # run_serve_on_ray(...)

``app``/``build_app`` make an application whose replicas run the same app and engine as
``ember serve`` (see ``ember.integrations._ray_serve``); ``EmberServer``, ``EmbeddingServer``,
``VisionServer`` and ``EmberIngress`` are its deployments. Importing them imports Ray.

Ray Data: ``Embedder``, ``Classifier`` and ``Generator`` are callable classes for
``Dataset.map_batches``; each actor loads its model once and maps numpy batches (a dict of
column name -> array)::

    ds.map_batches(Embedder, fn_constructor_kwargs={"model": PATH}, batch_size=64, concurrency=2)

They need neither Ray nor Ray Data to be called directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import EmberError

_SERVE_EXPORTS = (
    "EmberAppArgs",
    "EmberIngress",
    "EmberServer",
    "EmbeddingServer",
    "VisionServer",
    "app",
    "build_app",
    "run_serve_on_ray",
)
__all__ = ["Classifier", "Embedder", "Generator", *_SERVE_EXPORTS]
_SERVE_NAMES = frozenset(_SERVE_EXPORTS) | {"Forward", "detect_task", "deployment_options"}


def __getattr__(name: str) -> Any:
    """The Ray Serve names, imported (with Ray) on first use."""
    if name in _SERVE_NAMES:
        try:
            from ember.integrations import _ray_serve
        except ImportError as e:
            raise EmberError(
                f"ember.integrations.ray.{name} needs the 'ray' extra ({e.name} is missing): "
                "pip install 'ember[ray]'"
            ) from e
        return getattr(_ray_serve, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _column(batch: dict[str, np.ndarray], name: str, who: str) -> np.ndarray:
    if not isinstance(batch, dict):
        raise EmberError(
            f"{who} takes numpy batches (a dict of column -> array; map_batches' default "
            f"batch_format), got {type(batch).__name__}"
        )
    if name not in batch:
        raise EmberError(
            f"{who}: the batch has no column {name!r} (columns: {', '.join(batch) or 'none'}); "
            f"pass column=... in fn_constructor_kwargs"
        )
    return batch[name]


def _texts(values: np.ndarray, who: str, column: str) -> list[str]:
    out = []
    for i, v in enumerate(values.tolist() if isinstance(values, np.ndarray) else list(values)):
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        if not isinstance(v, str):
            raise EmberError(f"{who}: column {column!r} row {i} is {type(v).__name__}, not text")
        out.append(v)
    return out


def _threads(threads: int | None) -> None:
    if threads:
        import ember

        ember.set_num_threads(threads)


class Embedder:
    """Sentence embeddings for Dataset.map_batches: adds an `embedding` column (n, dim)."""

    def __init__(
        self,
        model: str | None = None,
        column: str = "text",
        output_column: str = "embedding",
        batch_size: int = 32,
        normalize: bool | None = None,
        threads: int | None = None,
    ) -> None:
        """Load a sentence-transformers folder once (None: the bundled all-MiniLM-L6-v2)."""
        from ember.models.sentence import SentenceTransformer

        if batch_size < 1:
            raise EmberError(f"Embedder: batch_size must be >= 1, got {batch_size}")
        _threads(threads)
        self.model = SentenceTransformer(model)
        self.column, self.output_column = column, output_column
        self.batch_size, self.normalize = batch_size, normalize

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch with its texts' embeddings added (float32)."""
        texts = _texts(_column(batch, self.column, "Embedder"), "Embedder", self.column)
        dim = self.model.get_sentence_embedding_dimension()
        emb = (
            self.model.encode(texts, self.batch_size, normalize_embeddings=self.normalize)
            if texts
            else np.zeros((0, dim), np.float32)
        )
        return {**batch, self.output_column: np.asarray(emb, np.float32)}


class Classifier:
    """Image classes for Dataset.map_batches: adds `label`, `class_index`, `probability`."""

    def __init__(
        self,
        model: str = "efficientnet_lite0",
        weights: str | None = None,
        column: str = "image",
        top: int = 1,
        threads: int | None = None,
    ) -> None:
        """Load an ember.models.vision classifier once (default: bundled EfficientNet-Lite0)."""
        from ember.models.vision.pipeline import ImageClassifier

        if top < 1:
            raise EmberError(f"Classifier: top must be >= 1, got {top}")
        _threads(threads)
        self.classifier = ImageClassifier.load(model, weights)
        self.column, self.top = column, top

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch with the best class of each image (HWC arrays, or encoded image bytes).

        With top > 1 the three columns hold (n, top) arrays, best first.
        """
        images = list(_column(batch, self.column, "Classifier"))
        rows = self.classifier(images, top=self.top) if images else []
        idx = np.array([[c for c, _, _ in r] for r in rows], np.int64).reshape(-1, self.top)
        lab = np.array([[s for _, s, _ in r] for r in rows], object).reshape(-1, self.top)
        prob = np.array([[p for _, _, p in r] for r in rows], np.float32).reshape(-1, self.top)
        if self.top == 1:
            idx, lab, prob = idx[:, 0], lab[:, 0], prob[:, 0]
        return {**batch, "label": lab, "class_index": idx, "probability": prob}


class Generator:
    """LLM completions for Dataset.map_batches: adds a `generated_text` column."""

    def __init__(
        self,
        model: str | None = None,
        column: str = "prompt",
        output_column: str = "generated_text",
        max_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        chat: bool = False,
        threads: int | None = None,
    ) -> None:
        """Load a GGUF file or Hugging Face folder once (None: the bundled SmolLM2)."""
        import argparse

        from ember.cli._llm import load
        from ember.generation.sampling import SamplingParams

        if max_tokens < 1:
            raise EmberError(f"Generator: max_tokens must be >= 1, got {max_tokens}")
        self.model, self.tokenizer = load(argparse.Namespace(model=model, threads=threads))
        self.sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
        self.column, self.output_column = column, output_column
        self.max_tokens, self.chat = max_tokens, chat

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch with each prompt's continuation (or chat answer, with chat=True)."""
        from ember.generation.generate import generate

        prompts = _texts(_column(batch, self.column, "Generator"), "Generator", self.column)
        if self.chat:
            prompts = [
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True
                )
                for p in prompts
            ]
        out = (
            generate(self.model, self.tokenizer, prompts, self.max_tokens, self.sampling)
            if prompts
            else []
        )
        return {**batch, self.output_column: np.array(out, dtype=object)}
