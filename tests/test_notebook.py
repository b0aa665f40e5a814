"""The example notebook runs end to end on the CPU (a CPU cluster from start_cluster) and checks itself."""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_multi_gpu_climate_notebook(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("GZ_TIME_STEPS", "6")
    nb = nbformat.read(os.path.join(ROOT, "examples", "multi_gpu_climate.ipynb"), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "max relative error against the float64 reference" in text
    assert "tasks," in text and "received from other workers" in text
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
