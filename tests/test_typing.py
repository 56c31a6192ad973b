"""The public API type-checks: mypy reads ember's annotations (py.typed) on typical user code.

The sample's annotated assignments (``y: ember.Tensor = x.sum()``) fail when a method's return
annotation is wrong; a second file holds lines that must fail, so the check can fail at all.
Also: the core modules import as a DAG (no loops, function-level imports included).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ember

pytest.importorskip("mypy")

GOOD = """
from __future__ import annotations

import ember
import ember.nn as nn
import ember.nn.functional as F
from ember import Tensor

x: Tensor = ember.randn(4, 3, requires_grad=True)
w: Tensor = ember.zeros(3, 2)
y: Tensor = x @ w
s: Tensor = y.sum()
m: Tensor = x.mean(dim=0, keepdim=True)
z: Tensor = (x + 1) * 2 - x / 3 + 2.0 ** x - abs(-x)
c: Tensor = (x > 0) & (x < 1) | ~(x == 0.5)
v: Tensor = x.reshape(12).view(3, 4).transpose(0, 1).T.mT.contiguous()
e: Tensor = x.exp().log1p().clamp(min=0.0).relu().softmax(-1)
parts: tuple[Tensor, ...] = x.split(2)
am: Tensor = x.argmax(dim=1)
mx: Tensor = x.max()
top = x.topk(2)
tv: Tensor = top.values
vals, inds = x.sort(dim=1)
vi: Tensor = x.max(dim=1).indices
row: Tensor = x[0]
x2 = x.detach().clone()
x2[0] = 1.0
x2.add_(1.0).mul_(2).zero_()
x2 += 1
n: int = x.size(0)
shape: ember.Size = x.size()
ndim: int = x.ndim
f: float = float(s)
ok: bool = x.allclose(x)
dt: ember.dtype = x.dtype
h: Tensor = x.to(ember.float16).float()
g: Tensor = ember.cat([x, x], dim=0)

lin = nn.Linear(3, 2)
out: Tensor = F.relu(lin(x))
loss = out.pow(2).mean()
opt = ember.optim.SGD(lin.parameters(), lr=0.1)
opt.zero_grad()
loss.backward()
opt.step()
with ember.no_grad():
    assert x.grad is not None
    x.sub_(x.grad * 0.1)
"""

BAD = """
import ember

x = ember.randn(2, 2)
a: str = x.sum()
b: int = x + 1
c: ember.Tensor = x.size(0)
d: ember.Tensor = x.split(1)
x.reshape(2, 2).no_such_method()
x.sum(keepdims=True)
"""


def _mypy_env() -> dict:
    env = dict(os.environ)
    root = Path(ember.__file__).resolve().parents[1]
    if "site-packages" not in root.parts:  # an editable or source checkout: tell mypy where
        env["MYPYPATH"] = str(root)
    return env


def test_public_api_typechecks(tmp_path):
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    cmd = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
           "--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary",
           "--hide-error-context", "--show-error-codes",
           str(tmp_path / "good.py"), str(tmp_path / "bad.py")]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=_mypy_env(), timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ": error:" in ln]
    good = [ln for ln in lines if "good.py" in ln]
    assert not good, "\n".join(good)
    bad_lines = {int(m.group(1)) for ln in lines if (m := re.search(r"bad\.py:(\d+):", ln))}
    expected = {
        i + 1
        for i, ln in enumerate(BAD.splitlines())
        if ln and not ln.startswith(("import", "x ="))
    }
    assert bad_lines == expected, r.stdout + r.stderr


def test_py_typed_ships():
    assert (Path(ember.__file__).parent / "py.typed").is_file()


# ------------------------------------------------------------------ the import graph
def _core(name: str) -> bool:
    """tensor.py, its mixins and helpers (ember._*), autograd and the ops."""
    top = name.split(".")[1] if "." in name else ""
    return name.startswith(("ember.tensor", "ember.autograd", "ember.ops")) or (
        name.count(".") == 1 and top.startswith("_")
    )


def _imports(path: Path, name: str, is_pkg: bool, known) -> set:
    """Every ember module `path` imports, at module or function level (not under TYPE_CHECKING)."""
    found = set()

    def visit(node):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                for c in ch.orelse:
                    visit(c)
                continue
            if isinstance(ch, ast.Import):
                found.update(a.name for a in ch.names)
            elif isinstance(ch, ast.ImportFrom):
                base = ch.module or ""
                if ch.level:
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - ch.level + 1]
                    base = ".".join(pkg + ([ch.module] if ch.module else []))
                for a in ch.names:  # `from pkg import submodule` imports the submodule
                    found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
            visit(ch)

    visit(ast.parse(path.read_text()))
    return found


def test_core_imports_form_a_dag():
    src = Path(ember.__file__).parent
    mods = {}
    for p in src.rglob("*.py"):
        parts = ["ember", *p.relative_to(src).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_pkg else parts)
        if _core(name):
            mods[name] = (p, is_pkg)
    graph = {
        n: {m for m in _imports(p, n, pkg, mods) if m in mods and m != n}
        for n, (p, pkg) in mods.items()
    }
    state: dict = {}

    def walk(n, path):
        state[n] = 1
        for m in graph[n]:
            if state.get(m) == 1:
                cycle = path[path.index(m) :] + [m]
                pytest.fail("import loop: " + " -> ".join(cycle))
            if m not in state:
                walk(m, [*path, m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            walk(n, [n])
    assert "ember.ops.movement" in graph and "ember.tensor" in graph
