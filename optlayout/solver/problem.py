"""One search problem, assembled in one place: a model and a job on a topology under cost constants and space
options, and what every search derives from it (the cost table, the usable memory, the model's limits, the
legal space). The CP-SAT solve, the oracle, explain, re-planning and run prediction all start here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from optlayout.cost import DEFAULT_PARAMS, CostParams, usable_memory_bytes
from optlayout.errors import InputError
from optlayout.layout.model import Layout
from optlayout.layout.rules import job_problems
from optlayout.solver.candidates import CostTable, Limits
from optlayout.solver.space import (
    LayoutGroup,
    SpaceNodes,
    SpaceOptions,
    enumerate_groups,
    enumerate_layouts,
    space_nodes,
)
from optlayout.specs import JobSpec, ModelSpec
from optlayout.topology import Topology

if TYPE_CHECKING:
    from optlayout.conditions.goodput import GoodputModel
    from optlayout.runs.uncertainty import LayoutUncertainty


@dataclass
class Problem:
    """What is searched. With `goodput`, candidates rank by goodput; with `robust`, by their conservative
    throughput (see `optlayout.solver.candidates`)."""

    model: ModelSpec
    job: JobSpec
    topology: Topology
    params: CostParams = DEFAULT_PARAMS
    options: SpaceOptions = field(default_factory=SpaceOptions)
    goodput: GoodputModel | None = None
    robust: LayoutUncertainty | None = None

    def __post_init__(self) -> None:
        problems = job_problems(self.model, self.job)
        if problems:
            raise InputError("; ".join(problems))

    @cached_property
    def table(self) -> CostTable:
        return CostTable(self.model, self.job, self.topology.gpu, self.topology, self.params, self.goodput,
                         self.robust)  # fmt: skip

    @property
    def capacity_bytes(self) -> float:
        """GPU memory a layout may fill (capacity less the job's headroom)."""
        return usable_memory_bytes(self.topology.gpu.memory_bytes, self.job)

    @property
    def limits(self) -> Limits:
        job = self.job
        return Limits(self.capacity_bytes, job.min_global_batch, job.max_global_batch, self.options.max_bubble_fraction)

    def groups(self) -> Iterator[LayoutGroup]:
        """The legal space in groups (see `LayoutGroup`)."""
        return enumerate_groups(self.model, self.job, self.topology.num_gpus, self.topology.domain_size, self.options)

    def nodes(self) -> SpaceNodes:
        """The legal space in the solver's bound nodes (see `SpaceNodes`)."""
        return space_nodes(self.model, self.job, self.topology.num_gpus, self.topology.domain_size, self.options)

    def layouts(self) -> Iterator[Layout]:
        """Every legal layout."""
        return enumerate_layouts(self.model, self.job, self.topology.num_gpus, self.topology.domain_size, self.options)
