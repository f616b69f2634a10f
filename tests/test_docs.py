"""The documentation stays true: its code examples run, its links and paths exist.

Every fenced ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` runs in a
subprocess of its own (``python -c``, as in an interpreter: dfdl's local clusters start
their workers with ``spawn``, which re-imports a script's main module), in an empty
temporary folder, with a timeout. A shell block (```` ```bash ````) runs only when the line
before it is ``<!-- run -->``; a Python block that cannot run here (a SLURM cluster, a
remote scheduler) has ``<!-- not run: reason -->`` before it and is reported as skipped
with its reason (``pytest -rs`` lists them). The blocks run a few at a time
(``DFDL_DOCS_JOBS``, default 3): most of their time is cluster start-up, not CPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TIMEOUT_S = 300
MARKER = re.compile(r"^<!--\s*(not run|run)\s*(?::\s*(.*?))?\s*-->$")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([^\s`]*)")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str | None  # "run", "not run" or None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        if self.marker == "not run":
            return False
        if self.language == "python":
            return True
        return self.language in ("bash", "sh", "console") and self.marker == "run"


def markdown_files() -> list[Path]:
    """README.md and the docs' Markdown sources (not the build, not generated pages)."""
    files = [ROOT / "README.md"]
    for path in sorted(DOCS.rglob("*.md")):
        parts = path.relative_to(DOCS).parts
        if parts[0] not in ("_build", "generated"):
            files.append(path)
    return files


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the marker line before each."""
    lines = path.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, language = m.group(1), m.group(2).lower()
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence):
            end += 1
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before)
        blocks.append(
            Block(
                path=path,
                line=i + 1,
                language=language,
                code="\n".join(lines[i + 1 : end]) + "\n",
                marker=marker.group(1) if marker else None,
                reason=(marker.group(2) or "") if marker else "",
            )
        )
        i = end + 1
    return blocks


def example_blocks() -> list[Block]:
    """Blocks that run, and Python blocks marked as not run (reported as skipped)."""
    return [
        b
        for path in markdown_files()
        for b in code_blocks(path)
        if b.runs or (b.marker == "not run" and b.language == "python")
    ]


def run_block(block: Block) -> subprocess.CompletedProcess:
    """Run one block in a fresh folder; its whole process group is killed on timeout."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if block.language == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    with tempfile.TemporaryDirectory(prefix="dfdl-docs-") as cwd:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += f"\n[timed out after {TIMEOUT_S} s]"
        return subprocess.CompletedProcess(argv, proc.returncode, out)


BLOCKS = example_blocks()


@pytest.fixture(scope="module")
def results(request):
    """The selected runnable blocks, started at once, a few at a time; each test waits for
    its own."""
    selected = {
        item.callspec.params["block"].id
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_example_runs"
    }
    jobs = int(os.environ.get("DFDL_DOCS_JOBS", "3"))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures: dict[str, Future] = {
            b.id: pool.submit(run_block, b) for b in BLOCKS if b.runs and b.id in selected
        }
        yield futures
        for f in futures.values():
            f.cancel()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example_runs(block: Block, results) -> None:
    if not block.runs:
        pytest.skip(f"not run: {block.reason}")
    done = results[block.id].result()
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-6000:]}"


def test_examples_are_found() -> None:
    """The parser sees the README's quick starts and every user-guide page's examples."""
    ids = {b.id for b in BLOCKS if b.runs}
    readme = [b for b in BLOCKS if b.path.name == "README.md"]
    assert {b.language for b in readme if b.runs} == {"python", "bash"}
    for page in ("training", "data", "memory", "dashboard", "security", "inference"):
        assert any(i.startswith(f"docs/user/{page}.md:") for i in ids), page
    assert len(ids) >= 10


def test_not_run_blocks_give_a_reason() -> None:
    skipped = [b for b in BLOCKS if not b.runs]
    assert skipped, "the SLURM examples are marked as not run"
    for b in skipped:
        assert len(b.reason) >= 10, f"{b.id}: say why the block is not run"


def test_marker_parsing(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n<!-- not run: needs SLURM -->\n```python\nimport x\n```\n\n"
        "<!-- run -->\n\n```bash\necho hi\n```\n\n```bash\nrm -rf /\n```\n\n"
        "````markdown\n```python\nnested\n```\n````\n"
    )
    got = [(b.line, b.language, b.marker, b.reason, b.runs) for b in code_blocks(page)]
    assert got == [
        (4, "python", "not run", "needs SLURM", False),
        (10, "bash", "run", "", True),
        (14, "bash", None, "", False),
        (18, "markdown", None, "", False),
    ]


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CODE_PATH = re.compile(r"`((?:dfdl|tests|bench|examples)/[\w./-]*\w)`")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_exist(path: Path) -> None:
    """Relative links point at files, and the repository paths the text names exist."""
    text = path.read_text()
    missing = []
    for target in LINK.findall(text):
        if "://" not in target and not (path.parent / target).exists():
            missing.append(f"link {target}")
    for name in CODE_PATH.findall(text):
        if not (ROOT / name).exists():
            missing.append(f"path {name}")
    assert not missing, f"{path.relative_to(ROOT)}: {missing}"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ops_table_lists_every_registered_op() -> None:
    from dfdl.ops import REGISTRY

    table = _load(DOCS / "_ext" / "generate.py", "dfdl_docs_generate").ops_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(REGISTRY)
    for op in REGISTRY.values():
        assert f"| `{op.name}` | {op.domain or 'ai.onnx'} |" in table, op.name
    conv = next(r for r in rows if r.startswith("| `Conv` |"))
    assert "| yes |" in conv and "cpu.conv" in conv and "contraction" in conv


def test_bench_reference_index_is_current() -> None:
    """bench/reference/README.md is what bench/reference_index.py writes today."""
    index = _load(ROOT / "bench" / "reference_index.py", "dfdl_reference_index")
    expected = index.render(ROOT / "bench" / "reference")
    assert (ROOT / "bench" / "reference" / "README.md").read_text() == expected, (
        "run: python bench/reference_index.py"
    )
