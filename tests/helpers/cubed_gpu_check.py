"""GPU smoke check of gpuzarr_dist.cubed (run on a GPU machine; exits nonzero on failure).

Run by ``tests/test_cubed.py``'s GPU test, or from the repository root::

    python -m tests.helpers.cubed_gpu_check

Checks, in this fresh process (cubed's backend is fixed at its import):
cubed gets the cupy backend; from_zarr_gpu gives cupy blocks equal to
zarr-python's read; the time mean and the time anomaly of an array 12x
allowed_mem equal numpy on 1 and 4 threads; every task's measured device peak
(CuPy pool) is within allowed_mem; intermediates are read through our read
path and written through our write path (every plain intermediate block
encoded by nvCOMP from a cupy block, none by zarr-python), and zarr-python (on
host buffers, numcodecs zstd) reads an intermediate back equal to what the
tasks wrote; the DistributedExecutor on a one-GPU LocalCluster (threads) gives the same
mean. Prints the timings and peaks.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback

import numpy as np

import gpuzarr_dist.cubed as gc

failures: list[str] = []


def check(name: str, fn) -> None:
    t = time.perf_counter()
    try:
        fn()
        print(f"ok   {name} ({time.perf_counter() - t:.2f} s)", flush=True)
    except Exception:
        failures.append(name)
        print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)


def main() -> int:
    import zarr

    work = tempfile.mkdtemp(prefix="gpu-check-cubed-")
    spec = gc.spec("24 MB", os.path.join(work, "tmp"), device="gpu")
    import cubed
    import cubed.array_api as xp
    import cupy

    from gpuzarr_dist.cubed import storage

    print("backend:", sys.modules["cubed.backend_array_api"].xp_name, "| spec:", spec)
    rng = np.random.default_rng(1)
    data = (250 + 20 * rng.standard_normal((96, 361, 720))).astype("f4")  # 100 MB, 4x the budget... x12 below
    src = os.path.join(work, "x.zarr")
    z = zarr.create_array(src, shape=data.shape, chunks=(2, 181, 180), dtype="f4",
                          compressors=zarr.codecs.ZstdCodec(level=0))
    z[:] = data
    ref_mean = data.astype("f8").mean(0)
    assert data.nbytes >= 4 * spec.allowed_mem

    class Peaks(cubed.Callback):
        def __init__(self):
            self.peaks = []

        def on_task_end(self, e):
            if e.name != "create-arrays":
                self.peaks.append((e.name, e.peak_measured_mem_end))

    def backend():
        assert "cupy" in sys.modules["cubed.backend_array_api"].namespace.__name__

    def read_equals_zarr():
        x = gc.from_zarr_gpu(src, spec=spec)
        part = x[10:30, 100:200, 50:400].compute()
        assert isinstance(part, cupy.ndarray), type(part)
        np.testing.assert_array_equal(part.get(), data[10:30, 100:200, 50:400])

    def mean_anomaly(threads):
        def run():
            # 16 MB: at 8 MB, cubed 0.28 projected one mean step at exactly allowed_mem on the H200
            s = gc.spec("16 MB", os.path.join(work, f"tmp{threads}"), device="gpu",
                        executor=gc.ThreadsExecutor(threads, device="gpu"))
            small = data[:, :181, :360].copy()  # 25 MB = 3x... use 12x: below
            big = np.concatenate([small] * 8, axis=0)  # 200 MB = 12.5x 16 MB
            p = os.path.join(work, f"s{threads}.zarr")
            zz = zarr.create_array(p, shape=big.shape, chunks=(2, 91, 90), dtype="f4",
                                   compressors=zarr.codecs.ZstdCodec(level=0))
            zz[:] = big
            assert big.nbytes >= 10 * s.allowed_mem
            reads = []
            orig = storage.IntermediateArray.__getitem__

            def spy(self, sel):
                reads.append(1)
                return orig(self, sel)

            from gpuzarr_dist.array import write
            from gpuzarr_dist.cuda import write as write_gpu
            blocks: dict[str, dict] = {}
            gpu_encodes = []
            orig_write, orig_gpu = write.BlockWriter.write, write_gpu.gpu_block_encoder

            def spy_write(self, block, start):
                assert isinstance(block, cupy.ndarray), f"{self.spec.name}: a {type(block)} block, not cupy"
                if len(blocks.setdefault(self.spec.name, {})) < 3:
                    blocks[self.spec.name][start] = block.get()
                return orig_write(self, block, start)

            def spy_gpu(*a, **k):
                gpu_encodes.append(1)
                return orig_gpu(*a, **k)

            storage.IntermediateArray.__getitem__ = spy
            write.BlockWriter.write = spy_write
            write_gpu.gpu_block_encoder = spy_gpu
            storage.reset_write_stats()
            try:
                x = gc.from_zarr_gpu(p, spec=s)
                pk = Peaks()
                t = time.perf_counter()
                m = xp.mean(x, axis=0).compute(callbacks=[pk])
                tm = time.perf_counter() - t
                out = os.path.join(work, f"an{threads}.zarr")
                t = time.perf_counter()
                cubed.to_zarr(x - xp.mean(x, axis=0), out, callbacks=[pk])
                ta = time.perf_counter() - t
                # the same with optimize_dag (mean computed once, not in each subtract task), timed per op
                ops = gc.OpTimings()
                out_opt = os.path.join(work, f"an{threads}-opt.zarr")
                t = time.perf_counter()
                cubed.to_zarr(x - xp.mean(x, axis=0), out_opt, callbacks=[pk, ops], optimize_function=gc.optimize_dag)
                ta_opt = time.perf_counter() - t
                big_writes = [r for r in ops.rows() if r["plan_write_bytes"] >= big.nbytes]  # arrays of x's size in the plan
                assert len(big_writes) == 1, f"x copied into an intermediate: {ops.table()}"
            finally:
                storage.IntermediateArray.__getitem__ = orig
                write.BlockWriter.write, write_gpu.gpu_block_encoder = orig_write, orig_gpu
            ws = storage.write_stats()
            m = m.get() if hasattr(m, "get") else np.asarray(m)
            r = big.astype("f8").mean(0)
            np.testing.assert_allclose(m, r, rtol=1e-5, atol=1e-3)
            with zarr.config.enable_gpu():
                an = zarr.open_array(out, mode="r")[:]
            an = an.get() if hasattr(an, "get") else an
            np.testing.assert_allclose(an, big - r, rtol=1e-5, atol=1e-2)
            with zarr.config.enable_gpu():
                an = zarr.open_array(out_opt, mode="r")[:]
            an = an.get() if hasattr(an, "get") else an
            np.testing.assert_allclose(an, big - r, rtol=1e-5, atol=1e-2)
            print(f"     optimize_dag anomaly {ta_opt:.2f} s:\n{ops.table()}")
            worst = max(pk.peaks, key=lambda e: e[1] or 0)
            print(f"     {threads} threads: mean {tm:.2f} s, anomaly {ta:.2f} s, {len(pk.peaks)} tasks, "
                  f"peak {worst[1]} B in {worst[0]} (allowed {s.allowed_mem}, reserved {s.reserved_mem}), "
                  f"{len(reads)} intermediate reads through gpuzarr (incl. the mean's n/total fields), writes {ws}, {len(gpu_encodes)} GPU encodes")
            assert all(p is not None and p <= s.allowed_mem for _, p in pk.peaks), worst
            assert worst[1] > 0, "no device allocation measured"
            assert reads, "intermediates not read through gpuzarr's read path"
            assert ws["blocks_encoded"] > 0 and ws["zarr_writes"] == 0, f"intermediate writes: {ws}"
            assert len(gpu_encodes) == ws["blocks_encoded"], (len(gpu_encodes), ws)
            inter = [n for n in blocks if f"an{threads}.zarr" not in n]
            assert inter, f"no intermediate written by us, only {list(blocks)}"
            cpu_buffers = {"buffer": "zarr.buffer.cpu.Buffer", "ndbuffer": "zarr.buffer.cpu.NDBuffer"}
            for name in inter[:2]:  # zarr-python on the host (numcodecs zstd) reads what nvCOMP wrote
                local = name[len("file://"):] if name.startswith("file://") else name
                with zarr.config.set(cpu_buffers):
                    za = zarr.open_array(local, mode="r")
                    for start, blk in blocks[name].items():
                        sel = tuple(slice(a, a + n) for a, n in zip(start, blk.shape))
                        got = za[sel]
                        assert isinstance(got, np.ndarray), type(got)
                        # the task's block is cast to the array's dtype on write, as zarr-python would
                        np.testing.assert_array_equal(got, np.asarray(blk).astype(za.dtype))
                print(f"     zarr-python read {name.rsplit('/', 1)[-1]} ({za.metadata.codecs}) = the tasks' blocks")

        return run

    def distributed_threads():
        import distributed

        with distributed.LocalCluster(n_workers=1, threads_per_worker=4, processes=False,
                                      dashboard_address=None) as c, distributed.Client(c) as client:
            s = gc.spec("24 MB", os.path.join(work, "tmpd"), device="gpu",
                        executor=gc.DistributedExecutor(client, device="gpu"))
            x = gc.from_zarr_gpu(src, spec=s)
            m = xp.mean(x, axis=0).compute()
            m = m.get() if hasattr(m, "get") else np.asarray(m)
            np.testing.assert_allclose(m, ref_mean, rtol=1e-5, atol=1e-3)

    def to_zarr_batches():
        """gc.to_zarr on the GPU: several chunks per block, all encoded by our writer (nvCOMP past min-batch)."""
        import dask

        from gpuzarr_dist.cuda import write as write_gpu

        calls = []
        orig = write_gpu.gpu_block_encoder
        write_gpu.gpu_block_encoder = lambda *a, **k: calls.append(1) or orig(*a, **k)
        try:
            s = gc.spec("24 MB", os.path.join(work, "tmpz"), device="gpu")
            x = gc.from_zarr_gpu(src, spec=s)
            chunks = (1,) + tuple(x.chunksize[1:])
            out = os.path.join(work, "to_zarr.zarr")
            storage.reset_write_stats()
            with dask.config.set({"gpuzarr.gpu.min-batch": 0}):  # every block through nvCOMP
                z = gc.to_zarr(x - xp.mean(x, axis=0), out, chunks=chunks)
        finally:
            write_gpu.gpu_block_encoder = orig
        ws = storage.write_stats()
        assert tuple(z.chunks) == chunks and ws["zarr_writes"] == 0 and calls, (z.chunks, ws, len(calls))
        with zarr.config.set({"buffer": "zarr.buffer.cpu.Buffer", "ndbuffer": "zarr.buffer.cpu.NDBuffer"}):
            got = zarr.open_array(out, mode="r")[:]
        assert isinstance(got, np.ndarray), type(got)
        np.testing.assert_allclose(got, data - ref_mean, rtol=1e-5, atol=1e-2)
        print(f"     to_zarr: blocks {tuple(x.chunksize)}, chunks {chunks}, {len(calls)} GPU block encodes, {ws}")

    check("cubed backend is cupy", backend)
    check("gc.to_zarr: chunks per block, nvCOMP encode, zarr-python reads it", to_zarr_batches)
    check("from_zarr_gpu equals zarr-python, cupy blocks", read_equals_zarr)
    check("mean + anomaly, 1 thread, peaks within allowed_mem", mean_anomaly(1))
    check("mean + anomaly, 4 threads, peaks within allowed_mem", mean_anomaly(4))
    check("DistributedExecutor (LocalCluster, threads)", distributed_threads)
    print("FAILED:" if failures else "all passed", ", ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
