"""The layers import downward (docs: DESIGN "Data flows one way").

`ember.nn` and `ember.models` are driven by `generation`, `train`, `peft`, `serve`,
`integrations` and `cli`, so they never import them: not at module level, not inside a
function, not relatively, not through `importlib` with a module-name string, and not by reaching
`ember.generation...` as an attribute. Model files also import no kernels (`ember.kernels`):
fast paths are kernels registered behind the ops. The scanner is tried on snippets that break
each rule, so the check can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ember

SRC = Path(ember.__file__).parent
DRIVERS = (
    "ember.generation",
    "ember.train",
    "ember.peft",
    "ember.serve",
    "ember.integrations",
    "ember.cli",
)
RULES = {  # package -> the ember packages its modules must not reach
    "ember.nn": DRIVERS + ("ember.models",),
    "ember.models": DRIVERS + ("ember.kernels",),
}


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def reached(source: str, module: str, is_pkg: bool) -> set[str]:
    """Every ember module name `source` (the text of `module`) imports or names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([node.module] if node.module else []))
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import submodule`
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name and name.startswith("ember."):
                found.add(name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("ember.") and " " not in node.value:
                found.add(node.value)  # importlib.import_module("ember.generation...")
    return {m for m in found if m == "ember" or m.startswith("ember.")}


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(source: str, module: str, is_pkg: bool = False) -> list[str]:
    """`module -> target` for each import of `source` that points up."""
    out = []
    for package, banned in RULES.items():
        if not _under(module, package):
            continue
        for target in sorted(reached(source, module, is_pkg)):
            if any(_under(target, b) for b in banned):
                out.append(f"{module} -> {target}")
    return out


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        parts = ["ember", *path.relative_to(SRC).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        yield path, ".".join(parts[:-1] if is_pkg else parts), is_pkg


def test_nn_and_models_import_downward():
    checked, bad = 0, []
    for path, module, is_pkg in _modules():
        if any(_under(module, p) for p in RULES):
            checked += 1
            bad += violations(path.read_text(), module, is_pkg)
    assert checked > 30  # the scan found the packages
    assert not bad, "imports that point up:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "module, source",
    [
        ("ember.models.llama", "from ember.generation.generate import generate_ids"),
        (
            "ember.models.llama",
            "class M:\n    def generate(self):\n        from ember.generation import generate\n",
        ),
        ("ember.models.llama", "from ..generation import generate"),
        ("ember.models.llama", "from ember import generation"),
        ("ember.models.llama", "import ember.generation.sampling"),
        ("ember.models.llama", "import ember\nf = ember.generation.generate.generate_ids"),
        ("ember.models.llama", "import importlib\nimportlib.import_module('ember.generation')"),
        ("ember.models.whisper.model", "from ...serve import engine"),
        ("ember.models.gpt2", "from ember.kernels.cpu import gemm"),
        ("ember.nn.module", "from ember.models.llama import DecoderForCausalLM"),
        ("ember.nn.generation", "from ember.peft import LoraConfig"),
    ],
)
def test_scanner_catches_upward_imports(module, source):
    assert violations(source, module), source


def test_scanner_allows_downward_imports():
    source = (
        "import ember\nfrom ember import nn\nfrom ember.nn.generation import GenerationMixin\n"
        "from ..nn import functional as F\nx = ember.nn.functional.relu\n"
        '"""Transcription lives in the generation package."""\n'
    )
    assert violations(source, "ember.models.llama") == []
    assert violations("from ember.generation import generate", "ember.generation.whisper") == []
