"""``gpuzarr-dist bench train --quick`` on the CPU: the rows, the JSON; the group it trains on holds the synthetic
fields, and the loaders it compares deliver the same samples as zarr-python and tensorstore."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from gpuzarr_dist.bench import train as bench_train
from gpuzarr_dist.cli import main
from gpuzarr_dist.ml import ZarrLoader
from gpuzarr_dist.synthetic import Field


def test_bench_train_quick(tmp_path, capsys):
    code = main(["bench", "train", "--quick", "--device", "cpu", "--path", str(tmp_path / "data"),
                 "--out", str(tmp_path / "res")])
    out = capsys.readouterr().out
    assert code == 0, out
    with open(tmp_path / "res" / "bench-train.json") as f:
        doc = json.load(f)
    rows = {r["name"]: r for r in doc["rows"]}
    ours = rows["(a) ZarrLoader, loader alone"]
    assert ours["extra"]["samples_per_s"] > 0 and len(ours["extra"]["rates"]) == doc["meta"]["repeats"]
    for name in ("(b) DataLoader + zarr-python, loader alone", "(c) DataLoader + tensorstore, loader alone"):
        assert name in rows and name in out
        assert rows[name]["note"].startswith("skipped") or rows[name]["extra"]["samples_per_s"] > 0
    assert "loader alone" in out and "saved:" in out


def test_group_holds_the_fields_and_the_loaders_agree(tmp_path):
    path = str(tmp_path / "g.zarr")
    names = bench_train.make_group(path, 3, 5, 16, 24)
    assert names == ["t2m", "u10", "v10"]
    for c, n in enumerate(names):
        np.testing.assert_array_equal(zarr.open_array(path, path=n, mode="r")[3], Field(100 + c, 16, 24).step(3))
    assert bench_train.make_group(path, 3, 5, 16, 24) == names  # reused, not rewritten
    loader = ZarrLoader(path, variables=names, window={"time": 2, "latitude": 16}, stride={"time": 1}, batch_size=1,
                        shuffle=False, device="cpu", output="numpy")
    ours = [b[0] for b in loader]
    datasets = [bench_train.ZarrPythonDataset(path, names, 16, 5)]
    try:
        import tensorstore  # noqa: F401

        datasets.append(bench_train.TensorstoreDataset(path, names, 16, 5))
    except ImportError:
        pass
    for ds in datasets:
        assert len(ds) == len(ours) == 4
        for i in range(len(ds)):
            np.testing.assert_array_equal(ds[i], ours[i])


def test_unet_learns_the_shape():
    torch = pytest.importorskip("torch")
    model = bench_train.unet(3, base=4)
    x = torch.randn(2, 3, 16, 24)
    assert model(x).shape == x.shape
    trainer = bench_train.Trainer(model, torch.device("cpu"))
    before = [p.detach().clone() for p in model.parameters()]
    trainer.step(torch.randn(2, 3, 2, 16, 24))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_bench_train_runs_only_the_loaders_named(tmp_path, capsys):
    code = main(["bench", "train", "--quick", "--device", "cpu", "--loaders", "ours", "--path", str(tmp_path / "data"),
                 "--out", str(tmp_path / "res")])
    assert code == 0
    with open(tmp_path / "res" / "bench-train.json") as f:
        names = [r["name"] for r in json.load(f)["rows"]]
    assert names == ["(a) ZarrLoader, loader alone"]
    with pytest.raises(SystemExit, match="unknown loader.*'dali'.*choose from ours, zarr-python, tensorstore"):
        main(["bench", "train", "--quick", "--device", "cpu", "--loaders", "ours,dali", "--path", str(tmp_path / "data")])
