"""Sentence embeddings per second: ember vs sentence-transformers (torch), all-MiniLM-L6-v2.

Both sides embed the same 32 sentences (10-20 words) with the same thread count
(torch.set_num_threads / ember.set_num_threads), each engine timed in a process of its own (they
share libgomp, so in one process each one's spinning OpenMP threads slow the other), the
engines' processes alternating round by round:

- "1 sentence": ``encode(s)`` called for each sentence in turn (latency-bound serving);
- "32 sentences": one ``encode(sentences, batch_size=32)`` call (throughput).

Rows "encoder only" time the transformer alone on already-tokenized input: ember's packed
``BertModel.forward_packed`` against transformers' ``BertModel`` on the batch padded to its
longest sentence. The medians of the repeats are reported (and the best, which time spent
preempted by other jobs inflates least); the table and the command go to bench/RESULTS.md.
``--src PATH`` times another ember tree (its ``src`` folder), for before/after runs.

    .venv/bin/python bench/embed.py [--threads 2] [--repeat 15] [--src PATH] [--no-append]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_argv = sys.argv[1:]
SRC = next((a[6:] for a in _argv if a.startswith("--src=")), None) or next(
    (b for a, b in zip(_argv, _argv[1:]) if a == "--src"), os.path.join(ROOT, "src")
)
sys.path.insert(0, SRC)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "A man is playing a guitar on the street corner for tips.",
    "Scientists discovered a new species of frog in the rainforest last year.",
    "Please remember to bring your passport and tickets to the airport.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "She baked a chocolate cake for her grandmother's ninetieth birthday party.",
    "Our team will meet on Thursday afternoon to review the quarterly budget.",
    "The museum's new exhibition features paintings from the early Renaissance period.",
    "Heavy rain is expected across the northern region throughout the weekend.",
    "He forgot his umbrella and got completely soaked on the way home.",
    "Electric cars are becoming more affordable as battery prices continue to drop.",
    "The children built a sandcastle and decorated it with colorful seashells.",
    "This recipe calls for two cups of flour, three eggs and some milk.",
    "The hiking trail offers stunning views of the valley and distant mountains.",
    "Customer support answered my question quickly and solved the billing problem.",
    "Learning a new language takes patience, practice and a lot of curiosity.",
    "The train to Berlin was delayed by forty minutes because of a signal failure.",
    "Doctors recommend at least seven hours of sleep for most healthy adults.",
    "The startup raised ten million dollars to expand into European markets.",
    "A small cafe on the corner serves the best espresso in the whole city.",
    "Volunteers planted hundreds of trees along the river to prevent erosion.",
    "The novel tells the story of two sisters separated during the war.",
    "Our flight was cancelled, so we spent the night at an airport hotel.",
    "The software update fixes several security bugs and improves battery life.",
    "Astronomers observed a distant galaxy that formed shortly after the big bang.",
    "He practices the piano for an hour every morning before going to work.",
    "The city council approved a plan to build more bike lanes downtown.",
    "Fresh vegetables from the local farmers market taste much better than imported ones.",
    "The professor explained the theory with simple examples and clear diagrams.",
    "Our neighbors adopted a playful puppy from the animal shelter last week.",
    "Wind turbines generate a growing share of the country's electricity.",
    "The detective finally found the missing letter hidden inside an old book.",
]


def interleaved(fns: dict, repeat: int, clock=time.perf_counter) -> dict:
    """{name: [seconds]} timing each function once per round, rounds interleaved, one warm-up."""
    for f in fns.values():
        f()
    times: dict = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t = clock()
            f()
            times[k].append(clock() - t)
    return times


def table_rows(times: dict, n: int) -> list[str]:
    """Markdown rows: per case, embeddings/s (median, best) on both sides and their ratio."""
    rows = [
        ("1 sentence, encode() each", "1"),
        ("32 sentences, one encode()", "32"),
        ("encoder only, 32 sentences", "enc"),
    ]
    out = []
    for title, key in rows:
        te, tt = times[f"ember {key}"], times[f"torch {key}"]
        e, t = statistics.median(te), statistics.median(tt)
        eb, tb = min(te), min(tt)
        out.append(
            f"| {title} | {n / e:.0f} ({n / eb:.0f}) | {n / t:.0f} ({n / tb:.0f}) | "
            f"{t / e:.2f}x ({tb / eb:.2f}x) | {e * 1e3:.1f} | {t * 1e3:.1f} |"
        )
    return out


HEADER = [
    "| case | ember emb/s | torch emb/s | ember / torch | ember ms | torch ms |",
    "|---|---:|---:|---:|---:|---:|",
]


def setup(threads: int, only: str | None = None) -> dict:
    """Load both models with `threads` threads; the timed functions and facts about the inputs.

    only: "ember" or "torch": the timed functions of that engine alone (no facts)."""
    if only == "ember":
        import ember
        from ember.models.sentence import SentenceTransformer, default_model_dir

        ember.set_num_threads(threads)
        em = SentenceTransformer(default_model_dir())
        ids, types, cu = em.tokenize(SENTENCES)
        return {"fns": {
            "ember 1": lambda: [em.encode(s) for s in SENTENCES],
            "ember 32": lambda: em.encode(SENTENCES, batch_size=32),
            "ember enc": lambda: em.model.forward_packed(ids, cu, types),
        }}  # fmt: skip
    import torch
    from _common import set_threads
    from sentence_transformers import SentenceTransformer as STorch

    from ember.models.sentence import SentenceTransformer, default_model_dir

    if only == "torch":  # torch alone: no ember model, no numba in this process
        torch.set_num_threads(threads)
        st = STorch(str(default_model_dir()), device="cpu")
        hf = st[0].auto_model.eval()
        enc = st.tokenizer(SENTENCES, padding="longest", return_tensors="pt")

        def encoder():
            with torch.inference_mode():
                hf(**enc)

        return {"fns": {
            "torch 1": lambda: [st.encode(s) for s in SENTENCES],
            "torch 32": lambda: st.encode(SENTENCES, batch_size=32),
            "torch enc": encoder,
        }}  # fmt: skip

    set_threads(threads)
    d = str(default_model_dir())
    t0 = time.perf_counter()
    em = SentenceTransformer(d)
    t_ember = time.perf_counter() - t0
    t0 = time.perf_counter()
    st = STorch(d, device="cpu")
    t_torch = time.perf_counter() - t0
    hf = st[0].auto_model.eval()
    S = SENTENCES
    a, b = em.encode(S), st.encode(S)  # same vectors on both sides
    cos = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
    ids, types, cu = em.tokenize(S)  # pre-tokenized input for the encoder-only rows
    enc = st.tokenizer(S, padding="longest", return_tensors="pt")

    def torch_encoder():
        with torch.inference_mode():
            hf(**enc)

    fns = {
        "ember 1": lambda: [em.encode(s) for s in S],
        "torch 1": lambda: [st.encode(s) for s in S],
        "ember 32": lambda: em.encode(S, batch_size=32),
        "torch 32": lambda: st.encode(S, batch_size=32),
        "ember enc": lambda: em.model.forward_packed(ids, cu, types),
        "torch enc": torch_encoder,
    }
    facts = {"cos": cos, "load_ember": t_ember, "load_torch": t_torch, "tokens": int(cu[-1]),
             "longest": int(np.diff(cu).max())}  # fmt: skip
    return {"fns": fns, "facts": facts}


def main() -> None:
    """Run the comparison, print the table, append it to bench/RESULTS.md."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--src", help="the ember tree's src folder to time (--src=PATH)")
    ap.add_argument("--cpu-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--wall-child", choices=["ember", "torch"], help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.cpu_child:  # one thread each from the start; print CPU times as JSON
        env = setup(1)
        print(json.dumps(interleaved(env["fns"], args.repeat, time.process_time)))
        return
    if args.wall_child:  # one engine in this process; print wall times as JSON
        env = setup(args.threads, only=args.wall_child)
        print(json.dumps(interleaved(env["fns"], args.repeat)))
        return

    def child(*flags: str) -> dict:
        cmd = [sys.executable, __file__, f"--src={SRC}", "--threads", str(args.threads), *flags]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])

    load = os.getloadavg()
    wall: dict = {}
    rounds = 3
    per = max(1, -(-args.repeat // rounds))
    for _ in range(rounds):  # the engines' processes alternate
        for engine in ("ember", "torch"):
            for k, v in child("--wall-child", engine, "--repeat", str(per)).items():
                wall.setdefault(k, []).extend(v)
    env = setup(args.threads)  # the facts: cosine, load times, token counts
    cpu = child("--cpu-child", "--repeat", str(args.repeat))

    import numba
    import torch
    import transformers
    from _common import append, blas_info

    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel ran
        layer = "no parallel"
    f = env["facts"]
    n_words = [len(s.split()) for s in SENTENCES]
    mkl = f"MKL {torch.backends.mkl.is_available()}, oneDNN {torch.backends.mkldnn.is_available()}"
    lines = [
        f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences of {min(n_words)}-{max(n_words)} words "
        f"({f['tokens']} tokens, longest {f['longest']}); median (best) of {rounds * per} "
        f"repeats; load average at start {load[0]:.2f}. Min cosine ember vs "
        f"sentence-transformers: {f['cos']:.7f}. Load time: ember {f['load_ember'] * 1e3:.0f} ms, "
        f"sentence-transformers {f['load_torch'] * 1e3:.0f} ms. numba {numba.__version__} "
        f"({layer} threads), torch {torch.__version__} ({mkl}), "
        f"transformers {transformers.__version__}.",
        "",
        f"Wall time, {args.threads} threads each, each engine in a process of its own "
        f"({rounds} alternating rounds of {per} repeats):",
        "",
        *HEADER,
        *table_rows(wall, len(SENTENCES)),
        "",
        "CPU time of a child process, 1 thread each (what other jobs inflate least):",
        "",
        *HEADER,
        *table_rows(cpu, len(SENTENCES)),
    ]
    table = "\n".join(lines) + "\n"
    print(f"BLAS: {blas_info()}\n")
    print(table)
    if not args.no_append:
        append("Sentence embeddings: ember vs sentence-transformers (bench/embed.py)", table)


if __name__ == "__main__":
    main()
