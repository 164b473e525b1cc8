"""Streamed k-means with per-region covariances, for activations too many to hold in memory.

The data arrive as batches of row vectors, pass after pass (re-running a model each pass is fine); nothing but a
uniform sample of them is kept. `StreamedKMeans` is fed with `observe(rows)` and told `end_pass()`, and runs:

1. a sampling pass: a uniform sample of `sample_size` rows (random-key reservoir) and the row count;
2. k-means++ seeding on the sample (greedy, 2 + ln K candidates per centre, as scikit-learn does);
3. `minibatch_epochs` passes of mini-batch k-means (each centre moves to the running mean of every row it has
   been assigned, Sculley 2010);
4. `lloyd_passes` exact Lloyd iterations, accumulated per region as shifted sums (rows minus their current centre)
   so float32 sums stay accurate; the last one also accumulates each region's scatter matrix, giving the
   covariance about the region's final mean.

The sample stays available (`sample`) for calibrating quantities that need the final centres.

>>> import torch
>>> rows = torch.cat([torch.randn(500, 3) + 10, torch.randn(500, 3) - 10])
>>> km = StreamedKMeans(2, seed=0)
>>> while not km.done:
...     for batch in rows.split(100):
...         km.observe(batch)
...     km.end_pass()
>>> sorted(round(c) for c in km.centers[:, 0].tolist()), km.counts.tolist()
([-10, 10], [500.0, 500.0])
"""

from __future__ import annotations

import math

import torch


class StreamedKMeans:
    """K-means over a stream of row batches; see the module docstring for the passes."""

    def __init__(
        self,
        num_regions: int,
        *,
        minibatch_epochs: int = 1,
        lloyd_passes: int = 1,
        sample_size: int = 16384,
        batch_rows: int = 4096,
        covariance: bool = True,
        seed: int = 0,
        device: torch.device | str | None = None,
    ):
        if num_regions < 1:
            raise ValueError(f"num_regions must be >= 1, got {num_regions}")
        if lloyd_passes < 1 and covariance:
            raise ValueError("the covariances come from a Lloyd pass: lloyd_passes must be >= 1")
        self.k = num_regions
        self.sample_size = max(sample_size, num_regions)
        self.batch_rows = batch_rows
        self.covariance = covariance
        self.device = torch.device(device) if device is not None else None
        self.generator = torch.Generator().manual_seed(seed)
        self.phases = ["sample"] + ["minibatch"] * minibatch_epochs + ["lloyd"] * lloyd_passes
        self.phase_index = 0
        self.rows_seen = 0
        self.sample: torch.Tensor | None = None
        self._sample_keys: torch.Tensor | None = None
        self.centers: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.covariances: torch.Tensor | None = None
        self._sums = self._scatter = None

    @property
    def done(self) -> bool:
        return self.phase_index >= len(self.phases)

    @property
    def phase(self) -> str:
        return self.phases[self.phase_index] if not self.done else "done"

    @property
    def passes(self) -> int:
        return len(self.phases)

    def observe(self, rows: torch.Tensor) -> None:
        """Feed a (n, d) batch of the current pass."""
        if self.done:
            raise RuntimeError("k-means has finished; no more passes are needed")
        rows = rows.detach().to(self.device or rows.device, torch.float32)
        if rows.ndim != 2:
            raise ValueError(f"expected a (rows, features) batch, got shape {tuple(rows.shape)}")
        if self.phase == "sample":
            self._observe_sample(rows)
            return
        for chunk in rows.split(self.batch_rows):
            if self.phase == "minibatch":
                self._observe_minibatch(chunk)
            else:
                self._observe_lloyd(chunk)

    def end_pass(self) -> None:
        if self.phase == "sample":
            if self.rows_seen < self.k:
                raise ValueError(
                    f"k-means into {self.k} regions needs at least {self.k} rows; the data gave {self.rows_seen}"
                )
            self.centers = kmeans_plus_plus(self.sample, self.k, self.generator)
            self.counts = torch.zeros(self.k, dtype=torch.float64, device=self.centers.device)
        elif self.phase == "lloyd":
            self._finish_lloyd()
        self.phase_index += 1

    def _observe_sample(self, rows: torch.Tensor) -> None:
        self.rows_seen += rows.shape[0]
        keys = torch.rand(rows.shape[0], generator=self.generator).to(rows.device)
        if self.sample is not None:
            rows = torch.cat([self.sample, rows])
            keys = torch.cat([self._sample_keys, keys])
        if rows.shape[0] > self.sample_size:
            keys, keep = keys.topk(self.sample_size)
            rows = rows[keep]
        self.sample, self._sample_keys = rows, keys

    def _observe_minibatch(self, rows: torch.Tensor) -> None:
        labels = nearest(rows, self.centers)
        batch_counts = torch.bincount(labels, minlength=self.k).to(self.counts.dtype)
        sums = torch.zeros_like(self.centers).index_add_(0, labels, rows)
        self.counts += batch_counts
        hit = batch_counts > 0
        # c ← c + (Σ_batch rows − n_batch·c) / n_total: the running mean of all rows the centre has been given.
        rate = (1.0 / self.counts[hit]).to(rows.dtype).unsqueeze(1)
        self.centers[hit] += rate * (sums[hit] - batch_counts[hit].to(rows.dtype).unsqueeze(1) * self.centers[hit])

    def _observe_lloyd(self, rows: torch.Tensor) -> None:
        if self._sums is None:
            self._sums = torch.zeros_like(self.centers, dtype=torch.float64)
            self.counts = torch.zeros(self.k, dtype=torch.float64, device=self.centers.device)
            if self._is_last_pass() and self.covariance:
                d = self.centers.shape[1]
                self._scatter = torch.zeros(self.k, d, d, dtype=torch.float32, device=self.centers.device)
        labels = nearest(rows, self.centers)
        shifted = rows - self.centers[labels]
        self.counts += torch.bincount(labels, minlength=self.k).to(torch.float64)
        self._sums.index_add_(0, labels, shifted.to(torch.float64))
        if self._scatter is not None:
            for region in labels.unique().tolist():
                part = shifted[labels == region]
                self._scatter[region] += part.T @ part

    def _finish_lloyd(self) -> None:
        filled = self.counts > 0
        mean_shift = torch.zeros_like(self._sums)
        mean_shift[filled] = self._sums[filled] / self.counts[filled].unsqueeze(1)
        if self._scatter is not None:
            # Scatter about the old centre c, over n rows, mean shift δ: covariance about the mean = S/n − δδᵀ.
            scale = torch.where(filled, 1.0 / self.counts.clamp_min(1), torch.zeros_like(self.counts))
            delta = mean_shift.to(torch.float32)
            self.covariances = (
                self._scatter * scale.to(torch.float32)[:, None, None]
                - torch.einsum("ki,kj->kij", delta, delta) * filled.to(torch.float32)[:, None, None]
            )
        self.centers = self.centers + mean_shift.to(self.centers.dtype)
        self._sums = self._scatter = None

    def _is_last_pass(self) -> bool:
        return self.phase_index == len(self.phases) - 1


def relative_to_centers(rows: torch.Tensor, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows and centres moved so the centres' mean is the origin.

    Distances are computed as ‖x‖² − 2xᵀc + ‖c‖², whose float32 rounding grows with ‖x‖²: activations far from
    the origin (large mean components are common in LLMs) would be assigned almost at random without this shift.
    """
    origin = centers.mean(0)
    return rows - origin, centers - origin


def squared_distances(rows: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """(n, K) squared Euclidean distances, clamped at 0 against rounding."""
    rows, centers = relative_to_centers(rows, centers)
    return (rows.pow(2).sum(1, keepdim=True) - 2 * rows @ centers.T + centers.pow(2).sum(1)).clamp_min(0)


def nearest(rows: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    # argmin ‖x − c‖² = argmax (2 xᵀc − ‖c‖²): the ‖x‖² term does not change the winner.
    rows, centers = relative_to_centers(rows, centers)
    return (2 * rows @ centers.T - centers.pow(2).sum(1)).argmax(1)


def inertia(rows: torch.Tensor, centers: torch.Tensor, batch_rows: int = 8192) -> float:
    """Sum over rows of the squared distance to the nearest centre (scikit-learn's `inertia_`)."""
    return float(
        sum(
            squared_distances(chunk.float(), centers.float()).min(1).values.double().sum()
            for chunk in rows.split(batch_rows)
        )
    )


def kmeans_plus_plus(rows: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Greedy k-means++ seeds: each new centre is the best of 2 + ln k candidates drawn ∝ D², by potential."""
    n = rows.shape[0]
    trials = 2 + int(math.log(k))
    first = int(torch.randint(n, (1,), generator=generator))
    centers = [rows[first]]
    closest = squared_distances(rows, rows[first : first + 1]).squeeze(1)
    for _ in range(1, k):
        total = closest.sum()
        if total <= 0:  # fewer distinct rows than centres: duplicates are the only choice left
            candidates = torch.randint(n, (trials,), generator=generator)
        else:
            candidates = torch.multinomial(
                closest.cpu().double() / float(total), trials, replacement=True, generator=generator
            )
        candidates = candidates.to(rows.device)
        candidate_closest = torch.minimum(closest.unsqueeze(0), squared_distances(rows, rows[candidates]).T)
        best = int(candidate_closest.sum(1).argmin())
        closest = candidate_closest[best]
        centers.append(rows[candidates[best]])
    return torch.stack(centers).clone()
