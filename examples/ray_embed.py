"""Embed a few thousand sentences with Ray Data and ember, and write them to Parquet.

    python examples/ray_embed.py                       # a local Ray, 3000 sentences, ./embeddings
    python examples/ray_embed.py --address 127.0.0.1:6379 --n 5000 --out /tmp/emb

Each of the --concurrency actors loads the bundled all-MiniLM-L6-v2 (or --model) once and
embeds batches of --batch-size sentences (``ember.integrations.ray.Embedder``); the output is
one Parquet folder with the columns id, text and embedding (384 float32 values a row).
The sentences are made up here from a small grammar, so the example needs no download.
"""

from __future__ import annotations

import argparse
import itertools
import time

SUBJECTS = ["The cat", "A child", "My neighbour", "The old sailor", "A small robot", "The teacher",
            "Our dog", "The pilot", "A curious fox", "The baker"]  # fmt: skip
VERBS = ["watches", "paints", "repairs", "finds", "carries", "describes", "forgets", "loves"]
OBJECTS = ["a red kite", "the river at dawn", "an empty train", "the broken clock",
           "a bowl of soup", "the northern lights", "a stack of letters", "the garden gate"]  # fmt: skip
PLACES = ["in the rain", "after school", "near the harbour", "before breakfast", "at midnight",
          "on a quiet hill", "in the market", "during the storm"]  # fmt: skip


def sentences(n: int) -> list[str]:
    """n different sentences (subject, verb, object, place), in a fixed order."""
    combos = itertools.product(SUBJECTS, VERBS, OBJECTS, PLACES)
    out = [f"{s} {v} {o} {p}." for s, v, o, p in itertools.islice(combos, n)]
    if len(out) < n:
        raise SystemExit(f"--n: this grammar makes at most {len(out)} sentences")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", help="Ray cluster to join (default: start a local one)")
    ap.add_argument("--n", type=int, default=3000, help="how many sentences (default 3000)")
    ap.add_argument("--out", default="embeddings", help="Parquet output folder")
    ap.add_argument("--model", help="sentence-transformers folder (default: bundled MiniLM)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=2, help="embedding actors")
    ap.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per actor and write task")
    ap.add_argument("--threads", type=int, default=1, help="ember threads per actor")
    args = ap.parse_args(argv)

    import pyarrow.parquet as pq
    import ray

    from ember.integrations.ray import Embedder

    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:
        ray.init(log_to_driver=False, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    texts = sentences(args.n)
    t0 = time.perf_counter()
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
    ds = ds.map_batches(
        Embedder,
        fn_constructor_kwargs={"model": args.model, "threads": args.threads},
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        num_cpus=args.num_cpus,
    )
    ds.write_parquet(args.out, ray_remote_args={"num_cpus": args.num_cpus})
    rows = pq.read_table(args.out, columns=["id"]).num_rows
    print(f"embedded {rows} sentences into {args.out} in {time.perf_counter() - t0:.1f} s")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
