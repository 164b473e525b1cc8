"""An experiment whose unit is one seed made of arms that several processes share (the real-checkpoint ones).

A seed's raw record is the kept one when there is one (read without the model: `kinfolk lab check` runs where the
checkpoint is absent), else what its runs make, None while another process still makes one of its arms: `make_run`
then moves on to the next seed, and `load_run` refuses to analyse a seed that is not whole.

>>> class Runs:  # what makes a seed's record; here every seed's arms are still being made elsewhere
...     record_version = 1
...     record_key = staticmethod(str)
...     def __init__(self, settings): pass
...     def record(self, seed): return None
>>> class Toy(SharedSeedExperiment):
...     name, version, settings_class = "toy", "1", dict
...     primaries = units = selection_rules = select = analyse = None
...     def runs_class(self): return Runs
>>> import tempfile, types
>>> toy = Toy(types.SimpleNamespace(records=tempfile.mkdtemp()))
>>> toy.make_run(3, 0) is None
True
>>> toy.load_run(3, 0)
Traceback (most recent call last):
RuntimeError: seed 3: another process is still making one of its arms; analyse when it ends
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from kinfolk.lab.protocol.experiment import Experiment
from kinfolk.lab.protocol.records import kept_record


class SeedRuns(Protocol):
    """What makes one seed's raw record: its arms, shared by processes through their claims."""

    record_version: ClassVar[int]

    @staticmethod
    def record_key(seed: int) -> str: ...

    def __init__(self, settings: Any) -> None: ...

    def record(self, seed: int) -> dict[str, Any] | None: ...


class SharedSeedExperiment(Experiment):
    """A seed-unit experiment whose seeds' arms processes share (see the module's docstring)."""

    unit_kind = "seed"

    @abstractmethod
    def runs_class(self) -> type[SeedRuns]:
        """The class that makes a seed's record, imported when first needed (it brings torch and the model)."""

    def kept(self, unit: int) -> dict[str, Any] | None:
        """The seed's kept record, or None while it is not whole."""
        runs = self.runs_class()
        return kept_record(self.settings.records, runs.record_key(unit), runs.record_version)

    def make_run(self, unit: int, run: int) -> Mapping[str, Any] | None:
        return self.kept(unit) or self.runs_class()(self.settings).record(unit)

    def load_run(self, unit: int, run: int) -> Mapping[str, Any]:
        record = self.make_run(unit, run)
        if record is None:
            raise RuntimeError(f"seed {unit}: another process is still making one of its arms; analyse when it ends")
        return record
