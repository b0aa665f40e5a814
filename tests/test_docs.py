"""The documentation: the site builds with warnings as errors, and its code examples run.

Every fenced ``python`` block of ``docs/*.md`` and ``README.md`` runs, in order
per page, in one fresh namespace per page, in a temporary working directory
that holds the demo's store as ``era5.zarr`` (a group with the array ``t2m``
and its coordinates, written by ``gpuzarr-dist demo``'s own code at 8 time steps). A
block that needs what CI does not have (a GPU or a GPU cluster, a batch
system, an object store) is marked by the line ``<!-- no-run -->`` right before
its fence; such blocks are still compiled, so they stay valid Python.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NO_RUN = "<!-- no-run -->"
STORE = "era5.zarr"
COMPONENT = "t2m"
TIME_STEPS = 8

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, code, runs)`` for each fenced python block of a markdown file, in order.

    ``line`` is the 1-based line of the block's first code line; ``runs`` is
    False when the fence is preceded by the no-run marker line.
    """
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip()
        runs = not before.endswith(NO_RUN)
        line = text.count("\n", 0, m.start(1)) + 1
        blocks.append((line, m.group(1), runs))
    return blocks


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _compile(path: Path, line: int, code: str):
    # padded so that a traceback's line numbers are the markdown file's
    return compile("\n" * (line - 1) + code, str(path), "exec")


RUNNABLE = [p for p in pages() if any(runs for _, _, runs in python_blocks(p))]


# --------------------------------------------------------------------------- the site


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: broken links, missing pages and docstring warnings fail it."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (it comes with the test and docs extras)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    site = tmp_path / "site"
    for page in ("index.html", "configuration/index.html", "api/index.html", "examples/index.html"):
        assert (site / page).is_file(), page
    config_page = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    import yaml

    for key in yaml.safe_load((ROOT / "gpuzarr_dist" / "gpuzarr.yaml").read_text(encoding="utf-8")):
        assert key in config_page, f"{key} missing from the generated configuration page"
    api_page = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("from_zarr_gpu", "to_zarr_gpu", "open_dataset", "start_cluster", "WindowSampler",
                 "sample_windows", "jobqueue_cluster", "GpuZarrError"):
        assert name in api_page, f"{name} missing from the API reference"


def _hooks():
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (it comes with the test and docs extras)")
    spec = importlib.util.spec_from_file_location("gpuzarr_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_hook_renders_every_key() -> None:
    hooks = _hooks()
    data = hooks.load_defaults()
    text = hooks.render(data)
    for key, entry in data.items():
        assert f"`{key}`" in text
        if entry.get("details"):
            assert f"{{ #{hooks.anchor(key)} }}" in text


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"default": 1}, "no description"),
        ({"default": 1, "description": "  "}, "no description"),
        ({"description": "x"}, "no default"),
        ({"default": 1, "description": "x", "colour": "red"}, "unknown fields"),
        ({"default": 1, "description": "x", "choices": "a, b"}, "choices must be a list"),
    ],
)
def test_config_hook_refuses_incomplete_keys(tmp_path: Path, entry: dict, message: str) -> None:
    import yaml

    hooks = _hooks()
    path = tmp_path / "gpuzarr.yaml"
    path.write_text(yaml.safe_dump({"gpuzarr.io-threads": entry}), encoding="utf-8")
    with pytest.raises(hooks.ConfigDocError, match=message) as info:
        hooks.load_defaults(str(path))
    assert "gpuzarr.io-threads" in str(info.value)


def test_site_links_of_shared_folders() -> None:
    hooks = _hooks()
    assert hooks.site_links("[r](../docs/reading.md#codecs)", "examples/README.md") == "[r](../reading.md#codecs)"
    assert hooks.site_links("[c](../../docs/clusters.md)", "cluster/jupyterhub/README.md") == "[c](../../clusters.md)"
    assert hooks.site_links("[s](slurm_gpu.py) [u](https://x.org/docs/a.md)", "cluster/slurm/README.md") == (
        "[s](slurm_gpu.py) [u](https://x.org/docs/a.md)")


# --------------------------------------------------------------------------- the examples


def test_pages_have_examples() -> None:
    """The block finder finds blocks (a changed fence style would otherwise skip them all silently)."""
    blocks = [b for p in pages() for b in python_blocks(p)]
    assert sum(runs for _, _, runs in blocks) >= 15
    assert any(not runs for _, _, runs in blocks)


@pytest.mark.parametrize("page", pages(), ids=_name)
def test_no_run_blocks_compile(page: Path) -> None:
    for line, code, runs in python_blocks(page):
        if not runs:
            _compile(page, line, code)


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store ``gpuzarr-dist demo`` writes, by the demo itself."""
    import io

    from gpuzarr_dist.demo import COMPONENT as DEMO_COMPONENT
    from gpuzarr_dist.demo import run_demo

    assert DEMO_COMPONENT == COMPONENT
    path = tmp_path_factory.mktemp("docs-store") / STORE
    assert run_demo(path, TIME_STEPS, device="cpu", out=io.StringIO()).ok
    return path


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_examples_run(page: Path, demo_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / STORE).symlink_to(demo_store, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    saved_env = dict(os.environ)
    namespace: dict = {"__name__": "__docs__"}
    try:
        for line, code, runs in python_blocks(page):
            if runs:
                exec(_compile(page, line, code), namespace)  # noqa: S102 (running the docs is the point)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
