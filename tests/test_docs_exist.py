"""A clone is self-contained: every ``*.md`` document that the README, the ``--help`` texts, the
code, the tests, the Makefile and the experiment / sweep YAMLs name exists in the repository, and
no code names a path on the machine it was written on."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MD_NAME = re.compile(r"(?<![\w{}*./-])((?:[\w.-]+/)*[\w-]+\.md)\b")
# Files a command writes (ulorl-tables' table1.md ...), not documents to read.
GENERATED = re.compile(r"^(table\d|claims|mismatch|mismatch_arms)\.md$")
CLI_MODULES = ("train", "sweep", "data", "bench", "sim", "eval", "tables", "dashboard", "clean")
SOURCES = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "platform").rglob("*.py")),
           *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "experiments").rglob("*.yaml")),
           *sorted((ROOT / "sweeps").rglob("*.yaml")), *sorted((ROOT / "dashboard").rglob("*.py")),
           *sorted((ROOT / "platform").rglob("*.md"))]
SOURCES = [p for p in SOURCES if p != Path(__file__).resolve()]   # this file names a missing one on purpose
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__"}


def _repo_md_files() -> list[Path]:
    return [p for p in ROOT.rglob("*.md") if not SKIP_DIRS & set(p.relative_to(ROOT).parts)
            and not p.relative_to(ROOT).parts[0].startswith(".venv")]


def _resolves(name: str, source: Path, files: list[Path]) -> bool:
    """A bare name: some document with that file name; a path: relative to the repo root or to
    the naming file's folder."""
    if "/" not in name:
        return any(p.name == name for p in files)
    return (ROOT / name).is_file() or (source.parent / name).is_file()


def _help_texts() -> dict[str, str]:
    out = {}
    for mod in CLI_MODULES:
        parser = importlib.import_module(f"ulorl.cli.{mod}").build_parser()
        texts = [parser.format_help()]
        for action in parser._actions:  # subcommands' help too
            if isinstance(action, argparse._SubParsersAction):
                texts += [p.format_help() for p in action.choices.values()]
        out[f"ulorl-{mod} --help"] = "\n".join(texts)
    return out


def _named(text: str) -> set[str]:
    return {m for m in MD_NAME.findall(text) if not GENERATED.match(Path(m).name)}


def test_every_named_document_exists():
    files = _repo_md_files()
    missing = []
    for src in SOURCES:
        for name in _named(src.read_text(encoding="utf-8", errors="replace")):
            if not _resolves(name, src, files):
                missing.append(f"{src.relative_to(ROOT)} names {name}")
    for where, text in _help_texts().items():
        for name in _named(text):
            if not _resolves(name, ROOT / "README.md", files):
                missing.append(f"{where} names {name}")
    assert not missing, "\n".join(sorted(missing))


def test_the_check_sees_the_documents_it_should():
    """Guard against a regex that matches nothing: the README and code really name documents."""
    names = set()
    for src in SOURCES:
        names |= _named(src.read_text(encoding="utf-8", errors="replace"))
    assert {"PAPER.md", "DESIGN.md", "STACK.md"} <= {Path(n).name for n in names}
    assert "table1.md" not in names
    assert not _resolves("NOWHERE.md", ROOT / "README.md", _repo_md_files())


@pytest.mark.parametrize("src", [p for p in SOURCES if p.suffix in (".py", ".yaml")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths(src):
    text = src.read_text(encoding="utf-8", errors="replace")
    assert not re.search(r"/work/|/home/\w+/|/Users/\w+/", text), f"{src.relative_to(ROOT)} names a machine path"


def test_design_module_map_matches_the_tree():
    """DESIGN.md's module map names every folder and top-level module of platform/ulorl, and nothing else."""
    text = (ROOT / "platform/ulorl/docs/DESIGN.md").read_text(encoding="utf-8")
    section = text[text.index("## Modules"):]
    section = section[:section.index("\n## ", 1)]
    listed = set(re.findall(r"^- `([a-z_]+/|[a-z_]+\.py)`", section, flags=re.M))
    pkg = ROOT / "platform/ulorl"
    tree = {p.name + "/" for p in pkg.iterdir() if p.is_dir() and not p.name.startswith("__")}
    tree |= {p.name for p in pkg.glob("*.py") if p.name != "__init__.py"}
    assert listed == tree, f"missing from the map: {sorted(tree - listed)}; not in the tree: {sorted(listed - tree)}"
