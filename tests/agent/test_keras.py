"""The Keras callback in a real ``model.fit`` (JAX backend, CPU), its records received by
the agent's train source: input-bound and compute-bound fits told apart, and the job
declared with the model's own parameter and tensor counts."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
pytest.importorskip("jax", reason="Keras runs on its JAX backend here")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402

from cmdare.agent.adapters.keras import CmdareCallback  # noqa: E402
from cmdare.agent.sources.train import TrainSource  # noqa: E402


class Batches(keras.utils.PyDataset):
    def __init__(self, n: int, batch: int, width: int, delay: float) -> None:
        super().__init__()
        self.n, self.batch, self.width, self.delay = n, batch, width, delay
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((batch, width)).astype("float32")
        self.y = rng.standard_normal((batch, 1)).astype("float32")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)  # a slow input pipeline (decode, augment) for this batch
        return self.x, self.y


def fit(job: str, sock: Path, width: int, hidden: int, delay: float, batches: int = 40) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((width,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(hidden),
            keras.layers.Dense(1),
        ],
        name=f"mlp{hidden}",
    )
    model.compile(optimizer="sgd", loss="mse")
    cb = CmdareCallback(job, batch_size=64, socket_path=str(sock), accelerator="cpu")
    model.fit(cb.data(Batches(batches, 64, width, delay)), epochs=2, verbose=0, callbacks=[cb])
    return model


def test_keras_fit_reports_steps_input_wait_and_the_model(tmp_path: Path) -> None:
    sock = Path(tempfile.mkdtemp(prefix="cmt-")) / "t.sock"
    src = TrainSource(TrainSource.parse_config("sources.train", {"socket": str(sock)}))
    src.start()
    try:
        slow = fit("keras-input", sock, width=32, hidden=32, delay=0.03)
        fast = fit("keras-compute", sock, width=512, hidden=1024, delay=0.0)
        time.sleep(0.3)
        got: list = []
        src.collect(lambda t, d, ts=None, job=None, **_: got.append((t, job, d)))
    finally:
        src.close()
    jobs = {j: d for t, j, d in got if t == "train_job"}
    assert jobs["keras-input"]["params"] == slow.count_params() and jobs["keras-input"]["tensors"] == 6
    assert (
        jobs["keras-compute"]["params"]
        == fast.count_params()
        == 512 * 1024 + 1024 + 1024 * 1024 + 1024 + 1025
    )
    assert (
        jobs["keras-compute"]["framework"] == "keras" and "jax" in jobs["keras-compute"]["framework_version"]
    )
    assert jobs["keras-compute"]["model"] == "mlp1024" and jobs["keras-compute"]["batch_size"] == 64

    def totals(job: str) -> tuple[int, float, float]:
        rows = [d for t, j, d in got if t == "train_steps" and j == job]
        n = sum(d["steps"] for d in rows)
        step = sum(d["step_mean_seconds"] * d["steps"] for d in rows)
        wait = sum(d["wait_mean_seconds"] * d["steps"] for d in rows)
        return n, wait / step, sum(d["examples"] for d in rows)

    n, share, examples = totals("keras-input")
    assert n == 2 * 40 and examples == 64 * 80  # every batch of both epochs is a step
    assert share > 0.5, share  # the 30 ms per batch fetch dominates a tiny model
    n, share, _ = totals("keras-compute")
    assert n == 80 and share < 0.1, share
