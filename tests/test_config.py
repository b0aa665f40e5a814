"""``gpuzarr_dist/gpuzarr.yaml`` is the one place of every setting: the package reads no key it does not
describe, dask holds its defaults, and the accessors read them as documented."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import dask
import pytest
import yaml

import gpuzarr_dist
from gpuzarr_dist import config

PACKAGE = Path(gpuzarr_dist.__file__).parent
SETTINGS = config.describe()
FIELDS = {"default", "choices", "description", "details"}
#: a dotted ``gpuzarr.*`` name in code or text (``gpuzarr.yaml`` is the file, not a key)
KEY_NAME = re.compile(r"(?<![\w/-])gpuzarr(?:\.[a-z][a-z0-9-]*)+(?![\w-]*\()")


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.fixture
def yaml_defaults():
    """Every setting at its default (the suite's conftest lowers the GPU's min-batch settings)."""
    with dask.config.set({key: entry["default"] for key, entry in SETTINGS.items()}):
        yield


def _default_of(nested: dict, key: str):
    node = nested
    for part in key.split("."):
        node = node[part]
    return node


# -- the file ------------------------------------------------------------------------------------


def test_the_file_ships_inside_the_package_and_matches_describe():
    path = PACKAGE / "gpuzarr.yaml"
    assert yaml.safe_load(path.read_text(encoding="utf-8")) == SETTINGS
    assert len(SETTINGS) >= 31


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_every_key_has_a_default_and_a_one_line_description(key):
    entry = SETTINGS[key]
    assert key.startswith("gpuzarr.") and key == key.lower()
    assert "default" in entry and set(entry) <= FIELDS, set(entry) - FIELDS
    description = entry["description"]
    assert isinstance(description, str) and description.strip() and "\n" not in description.strip()
    assert description.rstrip().endswith("."), description
    if "details" in entry:
        assert isinstance(entry["details"], str) and entry["details"].strip()
        assert not re.search(r"\bsession \d+", entry["details"], re.I)
    if "choices" in entry:  # spellings users type: strings (YAML would make a bare off/no a bool)
        assert all(isinstance(c, str) for c in entry["choices"]), entry["choices"]
        assert entry["default"] in entry["choices"]


def test_dask_holds_the_yaml_defaults():
    registered = dask.config.merge(*dask.config.defaults)
    for key, entry in SETTINGS.items():
        assert _default_of(registered, key) == entry["default"], key
        assert _default_of(config.DEFAULTS, key) == entry["default"], key


def test_get_reads_dask_and_falls_back_to_the_default():
    assert config.get("gpuzarr.io-threads") == dask.config.get("gpuzarr.io-threads")
    with dask.config.set({"gpuzarr.io-threads": 3}):
        assert config.get("gpuzarr.io-threads") == 3
    saved = dask.config.config.pop("gpuzarr")
    try:  # even with the whole subtree gone, a setting reads as its documented default
        assert config.get("gpuzarr.io-threads") == 16 and config.nvcomp_api() == "c"
    finally:
        dask.config.config["gpuzarr"] = saved


def test_describe_is_a_copy():
    mine = config.describe()
    mine["gpuzarr.io-threads"]["default"] = -1
    assert config.describe()["gpuzarr.io-threads"]["default"] == SETTINGS["gpuzarr.io-threads"]["default"]


def test_get_names_unknown_keys():
    with pytest.raises(KeyError, match="gpuzarr.no-such-key is not a gpuzarr setting"):
        config.get("gpuzarr.no-such-key")


# -- the package reads only what the file describes ----------------------------------------------


def test_every_gpuzarr_name_in_the_package_is_a_documented_key():
    """Keys in code, messages and docstrings: each a key of the file or a group of them (``gpuzarr.gpu``)."""
    groups = {k.rsplit(".", n)[0] for k in SETTINGS for n in range(1, k.count("."))}
    unknown = {}
    for path in _sources():
        for name in KEY_NAME.findall(path.read_text(encoding="utf-8")):
            name = name.rstrip(".-")
            if name != "gpuzarr.yaml" and name not in SETTINGS and name not in groups:
                unknown.setdefault(name, []).append(path.relative_to(PACKAGE).as_posix())
    assert not unknown, unknown


def test_settings_are_read_only_through_config():
    """No ``dask.config.get("gpuzarr....")`` outside config.py: only the whole subtree, which clusters hand on."""
    found = []
    for path in _sources():
        if path.name == "config.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and ast.unparse(node.func.value) == "dask.config" and node.args):
                continue
            first = node.args[0]
            text = first.value if isinstance(first, ast.Constant) else ast.unparse(first)
            if isinstance(text, str) and "gpuzarr" in text and text != "gpuzarr":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_every_key_has_an_accessor():
    source = (PACKAGE / "config.py").read_text(encoding="utf-8")
    literal = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    read_by_template = {"gpuzarr.block-size.cpu", "gpuzarr.block-size.gpu"}  # f"gpuzarr.block-size.{device}"
    assert set(SETTINGS) - literal <= read_by_template
    assert 'f"gpuzarr.block-size.{device}"' in source


def test_config_imports_nothing_from_the_package():
    tree = ast.parse((PACKAGE / "config.py").read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in modules if m and m.startswith("gpuzarr_dist")}, modules


def test_choice_constants_follow_the_file():
    assert config.LOCAL_READS == tuple(SETTINGS["gpuzarr.local-reads"]["choices"])
    assert config.NVCOMP_APIS == ("c", "python")
    assert config.ZSTD_CHECKS == ("headers", "sequences", "literals")  # shallow to deep: the order means something
    assert config.DEFLATE_CHECKS == ("walk", "off")
    assert config.SHARD_LOCAL_READS == ("preadv", "kvikio")
    assert list(config.SYNC_WAITS) == SETTINGS["gpuzarr.gpu.sync-wait"]["choices"]


# -- accessors, against the documented behaviour ----------------------------------------------------


def test_defaults_through_the_accessors(yaml_defaults):
    assert config.io_threads() == 16
    assert config.decode_threads() == (os.cpu_count() or 1)
    assert config.local_reads() == "auto"
    assert (config.io_retries(), config.io_retry_delay()) == (3, 0.05)
    assert (config.shard_merge_gap(), config.shard_max_range(), config.shard_local_reads()) == (None, 16 << 20, "preadv")
    assert (config.remote_concurrency(), config.remote_retries(), config.remote_backoff(), config.remote_timeout()) \
        == (64, 5, 0.1, 60.0)
    assert config.remote_block_bytes() == 128 << 20 and config.remote_malloc_thresholds() is True
    assert config.write_batch_bytes() is None
    assert (config.gpu_min_batch_bytes(), config.gpu_min_batch_chunks()) == (32 << 20, 8)
    assert (config.gpu_read_slots(), config.gpu_read_slot_min_bytes(), config.gpu_plan_turns()) == (1, 16 << 20, True)
    assert (config.gpu_decode_combine(), config.nvcomp_api(), config.encode_scratch_bytes()) == (False, "c", 2 << 30)
    assert (config.gpu_sync_wait(), config.zstd_check(), config.deflate_check()) == ("auto", "literals", "walk")
    assert config.deflate_walk_threads() == 0
    assert (config.window_part_chunks(), config.window_part_threads()) == (2048, 4)


@pytest.mark.parametrize("key, accessor, value, expected", [
    ("gpuzarr.gpu.nvcomp-api", config.nvcomp_api, " Python ", "python"),
    ("gpuzarr.gpu.deflate-check", config.deflate_check, "OFF", "off"),
    ("gpuzarr.gpu.zstd-check", config.zstd_check, "headers", "headers"),
    ("gpuzarr.local-reads", config.local_reads, "INLINE", "inline"),
    ("gpuzarr.shards.local-reads", config.shard_local_reads, "kvikio", "kvikio"),
    ("gpuzarr.shards.merge-gap", config.shard_merge_gap, "256 KiB", 256 << 10),
    ("gpuzarr.shards.merge-gap", config.shard_merge_gap, "auto", None),
    ("gpuzarr.shards.max-range", config.shard_max_range, 0, 1),
    ("gpuzarr.remote.concurrency", config.remote_concurrency, 0, 1),
    ("gpuzarr.remote.retries", config.remote_retries, -2, 0),
    ("gpuzarr.remote.timeout", config.remote_timeout, "5", 5.0),
    ("gpuzarr.remote.malloc-thresholds", config.remote_malloc_thresholds, False, False),
    ("gpuzarr.remote.malloc-thresholds", config.remote_malloc_thresholds, "off", False),
    ("gpuzarr.remote.block-size", config.remote_block_bytes, 0, 0),
    ("gpuzarr.write.batch-size", config.write_batch_bytes, "64 MiB", 64 << 20),
    ("gpuzarr.write.batch-size", config.write_batch_bytes, 0, None),
    ("gpuzarr.gpu.encode-scratch", config.encode_scratch_bytes, 0, None),
    ("gpuzarr.gpu.plan-turns", config.gpu_plan_turns, "off", False),
    ("gpuzarr.gpu.decode-combine", config.gpu_decode_combine, "yes", True),
    ("gpuzarr.gpu.read-slots", config.gpu_read_slots, "none", 0),
    ("gpuzarr.gpu.deflate-walk-threads", config.deflate_walk_threads, "64", 64),
    ("gpuzarr.decode-threads", config.decode_threads, 3, 3),
    ("gpuzarr.io-threads", config.io_threads, 0, 1),
    ("gpuzarr.windows.part-threads", config.window_part_threads, 0, 1),
    ("gpuzarr.loader.read-size", config.loader_read_size, "2 MiB", 2 * 2**20),
])
def test_accessor_reads_what_is_set(key, accessor, value, expected):
    with dask.config.set({key: value}):
        assert accessor() == expected


@pytest.mark.parametrize("key, accessor, value, message", [
    ("gpuzarr.gpu.nvcomp-api", config.nvcomp_api, "cuda", "gpuzarr.gpu.nvcomp-api must be one of c, python, not 'cuda'"),
    ("gpuzarr.gpu.sync-wait", config.gpu_sync_wait, "sleep",
     "gpuzarr.gpu.sync-wait must be one of auto, spin, yield, blocking, not 'sleep'"),
    ("gpuzarr.gpu.zstd-check", config.zstd_check, "none",
     "gpuzarr.gpu.zstd-check must be one of headers, sequences, literals, not 'none'"),
    ("gpuzarr.gpu.deflate-check", config.deflate_check, "skip", "gpuzarr.gpu.deflate-check must be one of walk, off"),
    ("gpuzarr.local-reads", config.local_reads, "mmap", "gpuzarr.local-reads must be one of auto, kvikio, threads, inline"),
    ("gpuzarr.shards.local-reads", config.shard_local_reads, "mmap", "gpuzarr.shards.local-reads must be one of preadv, kvikio"),
    ("gpuzarr.gpu.read-slots", config.gpu_read_slots, -1, "gpuzarr.gpu.read-slots must be a count of at least 0"),
    ("gpuzarr.gpu.min-batch", config.gpu_min_batch_bytes, -1, "gpuzarr.gpu.min-batch must be a size of at least 0"),
    ("gpuzarr.gpu.plan-turns", config.gpu_plan_turns, "maybe", "gpuzarr.gpu.plan-turns must be true or false"),
    ("gpuzarr.gpu.deflate-walk-threads", config.deflate_walk_threads, 2048,
     "gpuzarr.gpu.deflate-walk-threads must be 'auto' or 1..1024"),
])
def test_accessor_names_the_key_of_a_bad_value(key, accessor, value, message):
    with dask.config.set({key: value}), pytest.raises(ValueError, match=re.escape(message)):
        accessor()


def test_call_sites_read_through_the_accessors():
    from gpuzarr_dist.stores import ranges

    assert ranges.merge_gap(64 << 10) == 64 << 10  # unset: the store's own gap
    with dask.config.set({"gpuzarr.shards.merge-gap": "1 KiB", "gpuzarr.shards.max-range": "2 MiB"}):
        assert (ranges.merge_gap(64 << 10), ranges.max_range()) == (1 << 10, 2 << 20)


def test_clusters_hand_on_the_whole_subtree(yaml_defaults):
    from gpuzarr_dist.distributed.cluster import _gpuzarr_config
    from gpuzarr_dist.distributed.jobqueue import config_exports

    with dask.config.set({"gpuzarr.gpu.nvcomp-api": "python"}):
        handed = {"gpuzarr": _gpuzarr_config()}
        lines = config_exports()
        for key, entry in SETTINGS.items():
            expected = "python" if key == "gpuzarr.gpu.nvcomp-api" else entry["default"]
            assert _default_of(handed, key) == expected, key
    assert "export DASK_GPUZARR__GPU__NVCOMP_API=python" in lines
