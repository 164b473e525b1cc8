"""Streamed k-means with per-region covariances, for activations too many to hold in memory.

The data arrive as batches of row vectors, pass after pass (re-running a model each pass is fine); nothing but a
uniform sample of them is kept. `StreamedKMeans` is fed with `observe(rows)` and told `end_pass()`, and runs:

1. a sampling pass: a uniform sample of `sample_size` rows (random-key reservoir) and the row count;
2. k-means++ seeding on the sample (greedy, 2 + ln K candidates per centre, as scikit-learn does), refined by
   Lloyd iterations on the sample until no row changes region (at most `sample_iterations`);
3. `minibatch_epochs` passes of mini-batch k-means over all rows (each centre moves to the running mean of the
   rows it has been given, Sculley 2010; the counts start from the sample's, so the stream refines the sample's
   solution rather than restarting it);
4. `lloyd_passes` exact Lloyd iterations, accumulated per region as shifted sums (rows minus their current centre)
   so float32 sums stay accurate; the last one also accumulates each region's scatter matrix, giving the
   covariance about the region's final mean.

The sample stays available (`sample`) for calibrating quantities that need the final centres.

Across processes (`ranks=`, see `ranks.py`), each rank observes its own rows and the ranks pool what the passes
accumulate: the sample is the top `sample_size` random keys over all ranks' reservoirs; a mini-batch epoch runs on
each rank from the shared centres and the ranks then pool the rows each centre was given (so each centre ends at the
mean of all rows it was given, as in one process); the Lloyd sums, counts and scatter matrices are summed. After
each pass rank 0's centres are broadcast, so every rank holds the same bits. Nothing but the sample (at most
`sample_size` rows) and these sums travels.

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

from kinfolk.plugins.atlas.ranks import Ranks


class StreamedKMeans:
    """K-means over a stream of row batches; see the module docstring for the passes."""

    def __init__(
        self,
        num_regions: int,
        *,
        minibatch_epochs: int = 1,
        lloyd_passes: int = 1,
        sample_size: int = 16384,
        sample_iterations: int = 50,
        seed_rows: int = 8192,
        batch_rows: int = 4096,
        covariance: bool = True,
        seed: int = 0,
        device: torch.device | str | None = None,
        ranks: Ranks | None = None,
    ):
        if num_regions < 1:
            raise ValueError(f"num_regions must be >= 1, got {num_regions}")
        if lloyd_passes < 1 and covariance:
            raise ValueError("the covariances come from a Lloyd pass: lloyd_passes must be >= 1")
        self.k = num_regions
        self.sample_size = max(sample_size, num_regions)
        self.sample_iterations = sample_iterations
        self.seed_rows = seed_rows
        self.batch_rows = batch_rows
        self.covariance = covariance
        self.device = torch.device(device) if device is not None else None
        self.generator = torch.Generator().manual_seed(seed)
        self.ranks = ranks or Ranks()
        # Sample keys differ by rank (or the ranks would keep the same positions); everything drawn after the
        # sampling pass uses `generator`, which is then in the same state on every rank.
        self._key_generator = (
            torch.Generator().manual_seed(seed + 7919 * (self.ranks.rank + 1)) if self.ranks.many else self.generator
        )
        self.phases = ["sample"] + ["minibatch"] * minibatch_epochs + ["lloyd"] * lloyd_passes
        self.phase_index = 0
        self.rows_seen = 0
        self.sample: torch.Tensor | None = None
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._pending_rows = 0
        self.centers: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.covariances: torch.Tensor | None = None
        self._sums = self._scatter = None
        self._given = self._given_counts = self._given_from = self._given_start_counts = None

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
            self._pool_sample()
            if self.rows_seen < self.k:
                raise ValueError(
                    f"k-means into {self.k} regions needs at least {self.k} rows; the data gave {self.rows_seen}"
                )
            # k-means++ on a random part of the sample (as scikit-learn's MiniBatchKMeans seeds on `init_size`
            # rows); the Lloyd iterations on the whole sample then refine the seeds.
            pick = torch.randperm(self.sample.shape[0], generator=self.generator)[: max(self.seed_rows, self.k)]
            seeding = self.sample[pick.to(self.sample.device)]
            seeds = kmeans_plus_plus(seeding, self.k, self.generator)
            self.centers, labels = lloyd(self.sample, seeds, self.sample_iterations)
            self.counts = torch.bincount(labels, minlength=self.k).to(torch.float64)
        elif self.phase == "minibatch":
            self._pool_minibatch()
        else:
            self._finish_lloyd()
        self.phase_index += 1
        self._share_rank_zero()
        if self.phase == "minibatch" and self.ranks.many:
            self._given_from, self._given_start_counts = self.centers.clone(), self.counts.clone()
            self._given = torch.zeros_like(self.centers, dtype=torch.float64)
            self._given_counts = torch.zeros_like(self.counts)
        elif self.phase == "lloyd":
            self._start_lloyd()

    def _share_rank_zero(self) -> None:
        if self.ranks.many:
            self.centers = self.ranks.broadcast(self.centers)
            self.counts = self.ranks.broadcast(self.counts)
            if self.covariances is not None:
                self.covariances = self.ranks.broadcast(self.covariances)

    def _observe_sample(self, rows: torch.Tensor) -> None:
        # Reservoir by random keys: keep the rows with the largest keys, compacting only when twice over size.
        self.rows_seen += rows.shape[0]
        self._pending.append((rows, torch.rand(rows.shape[0], generator=self._key_generator).to(rows.device)))
        self._pending_rows += rows.shape[0]
        if self._pending_rows > 2 * self.sample_size:
            self._compact_sample()

    def _pool_sample(self) -> None:
        """The sampling pass's end: this rank's reservoir, then (across ranks) the top keys of all reservoirs."""
        if self._pending:
            self._compact_sample()
        if self.ranks.many:
            rows, keys = self._pending[0] if self._pending else (torch.zeros(0, 0), torch.zeros(0))
            width = max(self.ranks.each(rows.shape[1]))
            self.rows_seen = self.ranks.total(self.rows_seen)
            self.sample = self.ranks.top_rows(rows, keys, self.sample_size, width)
            if self.device is not None:
                self.sample = self.sample.to(self.device)
        self._pending = []

    def _compact_sample(self) -> None:
        rows = torch.cat([chunk for chunk, _ in self._pending])
        keys = torch.cat([chunk_keys for _, chunk_keys in self._pending])
        if rows.shape[0] > self.sample_size:
            keys, keep = keys.topk(self.sample_size)
            rows = rows[keep]
        self._pending, self._pending_rows = [(rows, keys)], rows.shape[0]
        self.sample = rows

    def _observe_minibatch(self, rows: torch.Tensor) -> None:
        labels = nearest(rows, self.centers)
        batch_counts = torch.bincount(labels, minlength=self.k).to(self.counts.dtype)
        sums = torch.zeros_like(self.centers).index_add_(0, labels, rows)
        if self._given is not None:  # the rows given to each centre, about the centres the epoch started from
            self._given.index_add_(0, labels, (rows - self._given_from[labels]).double())
            self._given_counts += batch_counts
        self.counts += batch_counts
        hit = batch_counts > 0
        # c ← c + (Σ_batch rows − n_batch·c) / n_total: the running mean of all rows the centre has been given.
        rate = (1.0 / self.counts[hit]).to(rows.dtype).unsqueeze(1)
        self.centers[hit] += rate * (sums[hit] - batch_counts[hit].to(rows.dtype).unsqueeze(1) * self.centers[hit])

    def _pool_minibatch(self) -> None:
        """Across ranks: each centre becomes the mean of its sample rows and of every row any rank gave it."""
        if self._given is None:
            return
        counts = self._given_start_counts + self.ranks.sum(self._given_counts)
        shift = self.ranks.sum(self._given)
        hit = counts > 0
        self.centers = self._given_from
        self.centers[hit] += (shift[hit] / counts[hit].unsqueeze(1)).to(self.centers.dtype)
        self.counts = counts
        self._given = self._given_counts = self._given_from = self._given_start_counts = None

    def _start_lloyd(self) -> None:
        self._sums = torch.zeros_like(self.centers, dtype=torch.float64)
        self.counts = torch.zeros(self.k, dtype=torch.float64, device=self.centers.device)
        if self._is_last_pass() and self.covariance:
            d = self.centers.shape[1]
            self._scatter = torch.zeros(self.k, d, d, dtype=torch.float32, device=self.centers.device)

    def _observe_lloyd(self, rows: torch.Tensor) -> None:
        labels = nearest(rows, self.centers)
        shifted = rows - self.centers[labels]
        self.counts += torch.bincount(labels, minlength=self.k).to(torch.float64)
        # per-chunk sums in float32 (rows minus their centre are small), accumulated across chunks in float64
        self._sums += torch.zeros_like(self.centers).index_add_(0, labels, shifted).double()
        if self._scatter is not None:
            for region in labels.unique().tolist():
                part = shifted[labels == region]
                self._scatter[region] += part.T @ part

    def _finish_lloyd(self) -> None:
        self.counts, self._sums = self.ranks.sum(self.counts), self.ranks.sum(self._sums)
        if self._scatter is not None:
            self._scatter = self.ranks.sum(self._scatter)
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


def _shifted(centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The centres' mean m and the centres about it.

    Distances expand as ‖x‖² − 2xᵀc + ‖c‖², whose float32 rounding grows with the magnitudes involved: with the
    centres taken about their mean, activations far from the origin (large mean components are common in LLMs)
    are still assigned correctly, and no shifted copy of the rows is needed.
    """
    origin = centers.mean(0)
    return origin, centers - origin


def squared_distances(rows: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """(n, K) squared Euclidean distances, clamped at 0 against rounding."""
    origin, shifted = _shifted(centers)
    rows = rows - origin
    return torch.addmm(rows.pow(2).sum(1, keepdim=True) + shifted.pow(2).sum(1), rows, shifted.T, alpha=-2).clamp_min(
        0
    )


def nearest(rows: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Index of each row's nearest centre."""
    return _assign(rows, centers)[0]


def _assign(rows: torch.Tensor, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest-centre labels and the winning scores 2xᵀs_k − (2m + s_k)ᵀs_k, which equal ‖x − m‖² − ‖x − c_k‖²
    (m the centres' mean, s_k = c_k − m), from one (n, d) × (d, K) product."""
    origin, shifted = _shifted(centers)
    scores = torch.addmm(((2 * origin + shifted) * shifted).sum(1), rows, shifted.T, beta=-1, alpha=2)
    best, labels = scores.max(1)
    return labels, best


def lloyd(
    rows: torch.Tensor, centers: torch.Tensor, iterations: int, tolerance: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd iterations on in-memory rows; returns the centres and their labels.

    Stops after `iterations`, when no row changes region, or when the inertia improves by less than `tolerance`
    (relative) in an iteration. A region left empty keeps its centre.
    """
    # Σ‖x − m‖² for any m from sums about a fixed reference r near the data: accurate in float32 far from the origin.
    reference = centers.mean(0)
    about_reference = rows - reference
    n = rows.shape[0]
    square_sum = float(torch.linalg.vector_norm(about_reference, dim=1).pow(2).double().sum())
    row_sum = about_reference.sum(0).double()
    del about_reference

    def current_inertia(centers, best):
        # Σ‖x − c‖² = Σ‖x − m‖² − Σ best (see `_assign`)
        offset = (centers.mean(0) - reference).double()
        to_origin = square_sum - 2 * float(offset @ row_sum) + n * float(offset @ offset)
        return to_origin - float(best.double().sum())

    labels, best = _assign(rows, centers)
    previous = current_inertia(centers, best)
    for _ in range(iterations):
        counts = torch.bincount(labels, minlength=centers.shape[0]).to(rows.dtype)
        sums = torch.zeros_like(centers).index_add_(0, labels, rows)
        filled = counts > 0
        centers = centers.clone()
        centers[filled] = sums[filled] / counts[filled].unsqueeze(1)
        new_labels, best = _assign(rows, centers)
        current = current_inertia(centers, best)
        if torch.equal(new_labels, labels) or previous - current <= tolerance * previous:
            return centers, new_labels
        labels, previous = new_labels, current
    return centers, labels


def inertia(rows: torch.Tensor, centers: torch.Tensor, batch_rows: int = 8192) -> float:
    """Sum over rows of the squared distance to the nearest centre (scikit-learn's `inertia_`), in float64."""
    centers = centers.double()
    return float(
        sum(squared_distances(chunk.double(), centers).min(1).values.sum() for chunk in rows.split(batch_rows))
    )


def kmeans_plus_plus(rows: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Greedy k-means++ seeds: each new centre is the best of 2 + ln k candidates drawn ∝ D², by potential."""
    n = rows.shape[0]
    trials = 2 + int(math.log(k))
    x = rows - rows.mean(0)
    norms = torch.linalg.vector_norm(x, dim=1).pow(2)

    def distances_to(indices: torch.Tensor) -> torch.Tensor:  # (len(indices), n)
        candidates = x[indices]
        return torch.addmm(norms.unsqueeze(1) + candidates.pow(2).sum(1), x, candidates.T, alpha=-2).clamp_min(0).T

    chosen = [int(torch.randint(n, (1,), generator=generator))]
    closest = distances_to(torch.tensor(chosen, device=rows.device))[0]
    for _ in range(1, k):
        potential = closest.double().cumsum(0).cpu()
        if potential[-1] <= 0:  # fewer distinct rows than centres: duplicates are the only choice left
            candidates = torch.randint(n, (trials,), generator=generator)
        else:
            draws = torch.rand(trials, generator=generator, dtype=torch.float64) * potential[-1]
            candidates = torch.searchsorted(potential, draws).clamp_max(n - 1)
        candidates = candidates.to(rows.device)
        candidate_closest = torch.minimum(closest.unsqueeze(0), distances_to(candidates))
        best = int(candidate_closest.sum(1).argmin())
        closest = candidate_closest[best]
        chosen.append(int(candidates[best]))
    return rows[chosen].clone()
