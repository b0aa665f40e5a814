"""The ``gpuzarr-dist`` command line, run in-process through ``gpuzarr_dist.cli.main``.

``info`` is compared with what zarr-python reports about the same array; the
demo and the example script run end to end on the CPU device with a few time
steps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc

import gpuzarr_dist
from gpuzarr_dist.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version_subprocess():
    r = subprocess.run([sys.executable, "-m", "gpuzarr_dist", "--version"], capture_output=True, text=True,
                       env=_env(), cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"gpuzarr-dist {gpuzarr_dist.__version__}"


def test_no_command_prints_help(capsys):
    code, out, err = run_cli(capsys)
    assert code == 2
    assert "demo" in err and "info" in err and "bench" in err


def test_info_v3_array_matches_zarr_python(tmp_path, capsys):
    path = str(tmp_path / "a.zarr")
    a = zarr.create_array(path, shape=(10, 21), chunks=(4, 8), dtype=">f8",
                          filters=[zc.TransposeCodec(order=(1, 0))],
                          compressors=[zc.ZstdCodec(level=3), zc.Crc32cCodec()])
    a[...] = np.arange(210.0).reshape(10, 21)
    code, out, err = run_cli(capsys, "info", path)
    assert code == 0, err
    ref = zarr.open_array(path, mode="r")
    assert f"shape        {tuple(ref.shape)}" in out
    assert f"dtype        {ref.dtype.newbyteorder('=')}" in out
    assert f"chunk shape  {tuple(ref.chunks)}" in out
    assert f"chunks       {ref.nchunks}" in out
    assert "zarr format  3" in out
    # every codec of zarr-python's metadata, in order, with its configuration
    names = [c.to_dict()["name"] for c in ref.metadata.codecs]
    assert names == ["transpose", "bytes", "zstd", "crc32c"]
    rows = [line.split()[0] for line in out.splitlines() if "GPU decode" in line]
    assert rows == names
    for codec in ref.metadata.codecs:
        conf = codec.to_dict().get("configuration") or {}
        assert json.dumps(conf, sort_keys=True) in out, (conf, out)
    assert '"level": 3' in out and '"order": [1, 0]' in out
    assert "auto blocks" in out and re.search(r"^\s+cpu\s+\(10, 21\)", out, re.M)
    assert re.search(r"^  device\s+(cpu|gpu) \(", out, re.M)


def test_info_v2_array(tmp_path, capsys):
    path = str(tmp_path / "v2.zarr")
    a = zarr.create_array(path, shape=(100,), chunks=(30,), dtype="<u4", zarr_format=2,
                          filters=[numcodecs.Delta(dtype="<u4")], compressors=numcodecs.Blosc(cname="lz4"))
    a[...] = np.arange(100, dtype="u4")
    code, out, err = run_cli(capsys, "info", path)
    assert code == 0, err
    ref = zarr.open_array(path, mode="r")
    assert "zarr format  2" in out
    assert f"shape        {tuple(ref.shape)}" in out and "dtype        uint32" in out
    assert f"chunks       {ref.nchunks}" in out
    rows = [line.split()[0] for line in out.splitlines() if "GPU decode" in line]
    assert rows == ["delta", "bytes", "blosc"]
    assert '"cname": "lz4"' in out


def test_info_group_lists_arrays(tmp_path, capsys):
    path = str(tmp_path / "g.zarr")
    g = zarr.open_group(path, mode="w")
    g.create_array("t2m", shape=(3, 4), chunks=(1, 4), dtype="f4")
    g.create_array("sub/u10", shape=(5,), chunks=(5,), dtype="i2")
    code, out, err = run_cli(capsys, "info", path)
    assert code == 0, err
    assert "2 array(s)" in out and "t2m" in out and "sub/u10" in out
    code, out, err = run_cli(capsys, "info", path, "--component", "sub/u10")
    assert code == 0, err
    assert "shape        (5,)" in out and "dtype        int16" in out
    assert out.splitlines()[0] == os.path.join(path, "sub", "u10")


def test_info_missing_path_exits_2(tmp_path, capsys):
    path = str(tmp_path / "nowhere.zarr")
    code, out, err = run_cli(capsys, "info", path)
    assert code == 2
    assert path in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_info_bad_metadata_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.zarr"
    path.mkdir()
    (path / "zarr.json").write_text("{not json")
    code, out, err = run_cli(capsys, "info", str(path))
    assert code == 2
    assert "zarr.json" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_demo_cpu_small(tmp_path, capsys):
    path = str(tmp_path / "era5.zarr")
    code, out, err = run_cli(capsys, "demo", "--time-steps", "3", "--device", "cpu", "--path", path)
    assert code == 0, out + err
    assert re.search(r"throughput\s+[0-9.]+ GB/s", out), out
    assert re.search(r"device\s+cpu \(", out)
    assert "matches" in out and "global mean" in out
    ref = zarr.open_array(path, path="t2m", mode="r")  # a Zarr v3 group with the array t2m, as zarr-python reads it
    assert ref.shape == (3, 721, 1440) and ref.dtype == np.float32 and ref.chunks == (1, 721, 1440)
    assert [c.to_dict()["name"] for c in ref.metadata.codecs] == ["bytes", "zstd"]
    # a second run reuses the complete store and gets the same answer
    code, out2, err = run_cli(capsys, "demo", "--device", "cpu", "--path", path)
    assert code == 0, out2 + err
    assert "reused, 3 time steps" in out2 and "matches" in out2


def test_demo_refuses_foreign_directory(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    code, out, err = run_cli(capsys, "demo", "--time-steps", "1", "--device", "cpu", "--path", str(tmp_path))
    assert code == 2
    assert "refusing" in err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_demo_reference_mean_matches_zarr_python(tmp_path):
    from gpuzarr_dist.demo import make_era5_like

    store = make_era5_like(str(tmp_path / "e.zarr"), 2, component="t2m")
    data = zarr.open_array(store.path, path="t2m", mode="r")[...]
    np.testing.assert_allclose(store.reference_mean(), data.astype(np.float64).mean(axis=0), rtol=1e-12)
    # reused: the reference is generated again, not read back
    again = make_era5_like(store.path, 2, component="t2m")
    assert again.reused
    np.testing.assert_allclose(again.reference_mean(), store.reference_mean(), rtol=0, atol=0)


def test_example_script_runs():
    script = os.path.join(ROOT, "examples", "era5_time_mean.py")
    r = subprocess.run([sys.executable, script, "--device", "cpu", "--time-steps", "2"], capture_output=True,
                       text=True, env=_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "global mean 2 m temperature" in r.stdout and " K" in r.stdout


def test_random_windows_example_runs():
    """The windows example reads its batches through WindowSampler.batches and checks one against zarr-python."""
    script = os.path.join(ROOT, "examples", "random_windows.py")
    r = subprocess.run([sys.executable, script, "--device", "cpu", "--batches", "5", "--in-flight", "3"],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "160 windows (4, 64, 64) in 5 batches on cpu" in r.stdout and "identical to zarr-python's" in r.stdout


def test_train_unet_example_runs_and_learns(tmp_path):
    """The training example writes its small group, trains two epochs through ZarrLoader on the CPU, and the
    loss goes down."""
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "examples", "train_unet.py")
    r = subprocess.run([sys.executable, script, "--device", "cpu"], capture_output=True, text=True, env=_env(),
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    losses = [float(line.split("loss ")[1].split(",")[0]) for line in r.stdout.splitlines() if line.startswith("epoch ")]
    assert len(losses) >= 2 and losses[-1] < losses[0], r.stdout
    assert "variables=['t2m', 'u10', 'v10']" in r.stdout and "samples/s" in r.stdout


@pytest.mark.parametrize("argv", [["demo", "--time-steps", "0"], ["demo", "--device", "tpu"], ["info", "a.zarr", "b.zarr"], ["cluster", "--n-gpus", "0"]])
def test_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2


def test_bench_write_quick(tmp_path, capsys):
    """``bench write --quick`` runs on the CPU: every tool's row, the ratio each achieved, the JSON, a read-back check."""
    code, out, err = run_cli(capsys, "bench", "write", "--quick", "--device", "cpu", "--time-steps", "2",
                             "--block-steps", "1", "--out", str(tmp_path / "res"), "--path", str(tmp_path / "new" / "dir"))
    assert code == 0, err
    assert "read back by zarr-python: identical" in out
    with open(tmp_path / "res" / "bench-write.json") as f:
        result = json.load(f)
    rows = {r["name"]: r for r in result["rows"]}
    assert {"gpuzarr-dist to_zarr_gpu", "zarr-python a[:] = data (numcodecs zstd)"} <= set(rows)
    assert any(name.startswith("dask.array.to_zarr") for name in rows)
    assert all(r["gbps"] > 0 and r["extra"]["ratio"] > 1 for r in rows.values())
    # on the CPU both write numcodecs zstd at its default level into the same chunks: the same bytes
    assert rows["gpuzarr-dist to_zarr_gpu"]["extra"]["ratio"] == pytest.approx(
        rows["zarr-python a[:] = data (numcodecs zstd)"]["extra"]["ratio"])
    assert result["meta"]["nbytes"] == 2 * 721 * 1440 * 4
    assert (tmp_path / "new" / "dir").is_dir()  # --path that did not exist is made, not an error


def test_bench_read_quick(tmp_path, capsys):
    """``bench read --quick`` runs on the CPU in seconds: both arrays, every tool's row warm and cold, the JSON."""
    code, out, err = run_cli(capsys, "bench", "read", "--quick", "--device", "cpu", "--out", str(tmp_path / "res"),
                             "--path", str(tmp_path / "data" / "era5.zarr"))
    assert code == 0, err
    assert "zstd check literals" in out  # the GPU walks' depth is printed with the figures it shapes
    for stem, driver_row in (("bench-read", "tensorstore"), ("bench-read-blosc", "tensorstore")):
        with open(tmp_path / "res" / f"{stem}.json") as f:
            result = json.load(f)
        rows = {(r["name"], r["cache"]) for r in result["rows"]}
        for cache in ("warm", "cold"):
            assert ("gpuzarr-dist from_zarr_gpu().mean(0)", cache) in rows
            assert ("zarr-python a[:].mean(0)", cache) in rows
            assert any(n.startswith("ceiling") and c == cache for n, c in rows)
            assert any(n.startswith(driver_row) and c == cache for n, c in rows)
        assert all(r["gbps"] > 0 for r in result["rows"])
        assert result["meta"]["zstd_check"] == "literals" and result["meta"]["time_steps"] == 8
    assert "reaches" in out and "of the file-read ceiling" in out


def test_bench_read_read_slots_rows(tmp_path, capsys):
    """``--read-slots N`` adds a row of ours with that setting, in the same run; the default's is printed."""
    code, out, err = run_cli(capsys, "bench", "read", "--quick", "--device", "cpu", "--codec", "zstd",
                             "--read-slots", "0", "--read-slots", "2", "--decode-combine", "--nvcomp-api",
                             "--out", str(tmp_path / "res"), "--path", str(tmp_path / "data" / "era5.zarr"))
    assert code == 0, err
    assert "read-slots 1, decode-combine off, nvcomp-api c" in out  # the defaults, beside the zstd check
    with open(tmp_path / "res" / "bench-read.json") as f:
        result = json.load(f)
    rows = {(r["name"], r["cache"]) for r in result["rows"]}
    for cache in ("warm", "cold"):
        assert ("gpuzarr-dist, read-slots any", cache) in rows and ("gpuzarr-dist, read-slots 2", cache) in rows
        assert ("gpuzarr-dist, decode-combine on", cache) in rows  # the other way round from the default
        assert ("gpuzarr-dist, nvcomp-api python", cache) in rows
    assert result["meta"]["read_slots"] == 1 and result["meta"]["decode_combine"] is False
    assert result["meta"]["nvcomp_api"] == "c"


def test_bench_shards_quick(tmp_path, capsys):
    from gpuzarr_dist.cli import main

    assert main(["bench", "shards", "--quick", "--device", "cpu", "--windows", "32", "--in-flight", "2",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "unsharded rate" in out and "windows/s" in out and "tensorstore" in out and "zarr-python" in out
    for size in (4, 16, 32):  # --quick: calls of an eighth, a half and all of 32 windows
        assert f"WindowSampler, {size} windows per call" in out
    assert "WindowSampler.batches, 2 calls of 16 in flight" in out and "/ zarr-python" in out
    assert (tmp_path / "bench-shards.json").exists()
    if "tensorstore, 32 reads in flight" in out:  # tensorstore installed: it gets as many windows in flight
        assert "tensorstore with a chunk cache per group, 32 reads in flight" in out
        assert "32 windows in flight: WindowSampler (32 per call) / tensorstore" in out
        assert "32 windows in flight as 2 calls: WindowSampler.batches / tensorstore" in out


def test_bench_remote_quick(tmp_path, capsys):
    from gpuzarr_dist.cli import main

    assert main(["bench", "remote", "--quick", "--device", "cpu", "--time-steps", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "raw GET, obstore" in out and "of the raw GET rate" in out
    assert (tmp_path / "bench-remote.json").exists()


@pytest.mark.slow
def test_bench_scale_quick(tmp_path, capsys):
    """``bench scale --quick`` on 1 and 2 CPU worker processes: every row warmed and repeated, the transfer counts
    and busy fractions, a fresh cluster's first computation with and without the warm-up, the time means checked
    against the float64 mean summed while the data was written (the run exits 1 on a mismatch)."""
    code, out, err = run_cli(capsys, "bench", "scale", "--quick", "--device", "cpu", "--repeats", "2", "--no-report",
                             "--out", str(tmp_path / "res"), "--path", str(tmp_path / "data"))
    assert code == 0, out + err
    with open(tmp_path / "res" / "bench-scale.json") as f:
        result = json.load(f)
    rows = {r["name"]: r for r in result["rows"]}
    assert {"0.05 GB/GPU time mean: 1 worker(s)", "0.05 GB/GPU time mean: 2 worker(s)",
            "0.05 GB/GPU time mean: 2 worker(s), dask placement"} <= set(rows)
    two = rows["0.05 GB/GPU time mean: 2 worker(s)"]["extra"]
    assert len(two["times"]) == 2 and two["placement"] is True and len(two["busy"]) == 2
    first = [r for n, r in rows.items() if "first compute" in n]
    assert len(first) == 2 and all(r["extra"]["first_tasks"]["compute"] > 0 for r in first)
    assert result["meta"]["large"]["error"] < 1e-5  # every store on one worker, against the reference mean
    assert "of the aggregate ceiling" not in out and "of the ceiling" in out
    reads = two["reads"]  # the read stages of one more run: each worker read its own store's files
    assert len(reads) == 2 and all(r["blocks"] > 0 and 0 < r["read_s"] and r["stored_gbps"] > 0 for r in reads.values())
    assert "GB/s stored while reading" in out and "file reads: 2 workers read" in out
    assert "by the read model 2 workers reach" in out


def test_read_bound_of_a_shared_host():
    """``n / (n r / s + 1 - r)``: n times one where nothing is read or the host gives n readers n times one;
    the host's sharing factor where reading is all there is; the 2-GPU figures of docs/design.md."""
    from gpuzarr_dist.bench.scale import read_bound

    assert read_bound(4, 0.0, 1.0) == 4 and read_bound(4, 0.7, 4.0) == pytest.approx(4)
    assert read_bound(4, 1.0, 2.6) == pytest.approx(2.6)
    assert read_bound(2, 0.79, 1.32) == pytest.approx(1.42, abs=0.005)
    assert read_bound(2, 0.5, 1.36) == pytest.approx(1.62, abs=0.005)
    assert read_bound(2, 0.5, 0.0) == 0.0


def test_stages_book_seconds_calls_and_bytes():
    """A stage's bytes add up over calls and threads; ``take`` hands them over and clears; off, nothing is kept."""
    import threading

    from gpuzarr_dist.runtime import stages

    stages.take(True)
    try:
        def work() -> None:
            mark = stages.stage_timer()
            mark("write: object writes", 1000)
            mark("write: encode")
            mark("write: object writes", 24)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = stages.take(False)
    finally:
        stages.enable(False)
    assert got["write: object writes"][1:] == (8, 4 * 1024) and got["write: encode"][1:] == (4, 0)
    assert all(sec >= 0 for sec, _, _ in got.values())
    assert stages.take(False) == {} and stages.stage_timer()("x", 5) is None and stages.snapshot() == {}
