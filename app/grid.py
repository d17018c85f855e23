"""Grid files of `ltd experiment` (app/experiment.py runs them), on the shared config system.

Grid file (YAML)::

    name: flickr8k_main              # output folder experiments/<name> unless --out
    base: flickr8k_baseline          # preset or YAML every cell starts from
    set: [train.epochs=15]           # overrides for every cell
    seeds: [0, 1, 2]
    eval_split: test                 # reported split; selection always uses data.val_split
    eval_shortcuts: [none]           # shortcut settings to evaluate every run with (SVL)
    nproc: 1                         # data-parallel processes per training run (`ltd train --nproc`)
    cells:
      - name: baseline
        set: [loss.mode=none]
      - name: ltd_constraint
        set: [loss.mode=constraint]
        sweep: {loss.eta: [0.1, 0.15, 0.2]}   # chosen on val rsum (mean over the sweep seeds)
        sweep_seeds: [0]                        # seeds used for the sweep (default: the first seed)
      - name: baseline_tuned                    # several keys at once: each value is a list of overrides
        sweep: {set: [[loss.tau=0.03, optim.lr=1.0e-3], [loss.tau=0.1, optim.lr=2.5e-4]]}
      - name: replayed
        set: [loss.mode=replay, "loss.lambda_schedule={out}/runs/ltd_constraint@eta=0.15/seed{next_seed}"]
      - name: pretrained                      # first: trained (every seed) before any sweep, so that
        first: true                           # sweeps may fine-tune from it:
      - name: fine_tuned                      # train.init_from={out}/runs/pretrained/seed{seed}/best.pt
        set: ["train.init_from={out}/runs/pretrained/seed{seed}/best.pt"]
    compare: [[ltd_constraint, replayed]]   # extra pairs (every cell is compared with the first)

``{seed}``, ``{next_seed}`` and ``{out}`` in a cell's overrides become the run's seed, the grid's next
seed (cyclic) and the grid's output folder: a replay cell reads the λ schedule of a constraint run that
an earlier cell trains (with ``{seed}`` the replay is bit-identical to that run, a determinism check;
with ``{next_seed}`` it applies another run's λ(t), not adapted to its own L_rec).

``nproc`` (the grid's, a cell's own, or ``ltd experiment --nproc`` in place of the grid's) schedules how
a run trains, not what: the global batch is the same on any number of processes.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from training.config import load_config
from training.config_base import Section, read_yaml, validate_as
from training.errors import UserFileNotFound, UserValueError


class GridCell(Section):
    name: str
    set: list[str] = Field(default_factory=list)  # overrides of this cell (after the grid's own)
    sweep: dict[str, list] = Field(default_factory=dict)  # {key: values}: one parameter, chosen on val rsum
    sweep_seeds: list[int] | None = None  # seeds of the sweep (default: the grid's first seed)
    seeds: list[int] | None = None  # this cell's seeds (default: the grid's)
    nproc: int | None = Field(None, ge=1)  # data-parallel processes per run (default: the grid's)
    first: bool = False  # trained before the sweeps (a pretrained model that they fine-tune from)

    @model_validator(mode="after")
    def _one_parameter(self) -> GridCell:
        if len(self.sweep) > 1:
            raise ValueError(f"cell {self.name}: sweep one parameter at a time")
        if self.first and self.sweep:
            raise ValueError(f"cell {self.name}: a 'first' cell (trained before the sweeps) cannot sweep")
        return self


class Grid(Section):
    """A grid file (see the module docstring); ``set`` holds the overrides common to every cell."""

    name: str = ""  # default: the file's name
    base: str = "synthetic_baseline"
    set: list[str] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0])
    eval_split: str = "test"
    eval_shortcuts: list[str] = Field(default_factory=lambda: ["none"])
    cells: list[GridCell] = Field(default_factory=list)
    relevance: str | None = "rougeL"
    compare: list[list[str]] = Field(default_factory=list)
    nproc: int = Field(1, ge=1)  # data-parallel processes per training run

    @model_validator(mode="after")
    def _cells(self) -> Grid:
        if not self.cells:
            raise ValueError("a grid needs a non-empty 'cells' list")
        names = [c.name for c in self.cells]
        if len(set(names)) != len(names):
            raise ValueError(f"every cell needs a unique 'name' (got {names})")
        for pair in self.compare:
            if not (len(pair) == 2 and all(p in names for p in pair)):
                raise ValueError(f"compare entries are [reference, cell] pairs of cell names, got {pair!r}")
        return self

    @property
    def common(self) -> list[str]:
        return self.set

    @property
    def raw(self) -> dict:
        """The grid as it runs (written to the output folder as grid.yaml)."""
        return self.model_dump(exclude_none=True)


def load_grid(path: str | Path, extra_set: list[str] | None = None) -> Grid:
    """Read and validate a grid file; ``extra_set`` (``ltd experiment --set``) is appended to its
    common overrides (cells' own ``set`` still win). Every cell's config is validated up front."""
    path = Path(path)
    if not path.is_file():
        raise UserFileNotFound(f"grid file not found: {path}")
    data = read_yaml(path)
    data.setdefault("name", path.stem)
    grid = validate_as(Grid, data, where=f"{path}: ")
    grid.set = grid.set + list(extra_set or [])
    for c in grid.cells:  # fail before hours of training
        (param, values), = c.sweep.items() if c.sweep else ((None, [None]),)
        for v in values:
            try:
                sets = sweep_sets(param, v) if param else []
            except ValueError as e:
                raise UserValueError(f"{path}: cell {c.name}: {e}") from None
            load_config(grid.base, grid.common + c.set + sets)
    return grid


def value_tag(v: object) -> str:
    """A sweep value as a folder name and a table cell: ``0.2``, or ``tau=0.03,lr=0.001`` for a
    setting of several keys."""
    if isinstance(v, (list, tuple)):
        return ",".join(value_tag(x.split("=", 1)[0].split(".")[-1] + "=" + x.split("=", 1)[1]) for x in v)
    return str(v).replace("/", "_").replace(" ", "")


def sweep_sets(param: str, value: object) -> list[str]:
    """The overrides one sweep value stands for: ``param=value``, or with ``param`` ``set`` the value's
    own list of overrides (a setting of several keys, e.g. a baseline tuned over τ and the learning
    rate with the same number of settings as the method it is compared with)."""
    if param != "set":
        return [f"{param}={value}"]
    if not (isinstance(value, list) and value and all(isinstance(x, str) and "=" in x for x in value)):
        raise ValueError(f"a 'set' sweep value is a list of KEY=VALUE overrides, got {value!r}")
    return list(value)


def sweep_label(cell: str, param: str, value: object) -> str:
    """The run folder's name of a sweep value: ``cell@eta=0.2``, ``cell@tau=0.1,lr=0.001``."""
    return f"{cell}@{'' if param == 'set' else param.split('.')[-1] + '='}{value_tag(value)}"


def substitute(sets: list[str], seed: int, seeds: list[int], out: Path) -> list[str]:
    """``{seed}``, ``{next_seed}`` (the grid's next seed, cyclic) and ``{out}`` in a cell's overrides."""
    nxt = seeds[(seeds.index(seed) + 1) % len(seeds)] if seed in seeds else seed
    return [x.replace("{seed}", str(seed)).replace("{next_seed}", str(nxt)).replace("{out}", str(out)) for x in sets]
