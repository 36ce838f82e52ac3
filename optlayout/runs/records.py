"""Measured runs in the run-record format of `shared/data/README.md` (JSON Lines, or CSV with dotted columns)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from optlayout.errors import InputError, describe_validation_error
from optlayout.presets import gpu_preset
from optlayout.specs import AttentionKernel, ClusterSpec, ModelSpec, Precision

LAYOUT_FIELDS = ("tp", "pp", "cp", "dp", "vp", "micro_batch", "sharding", "recompute", "sequence_parallel")


class RunJob(BaseModel):
    model_config = ConfigDict(extra="allow")

    seq_len: int = Field(gt=0)
    global_batch: int = Field(gt=0)
    precision: Precision = "bf16"
    attention_kernel: AttentionKernel | None = Field(None, description="flash | flash2 | naive; null = not stated")


# Frameworks that run an Ampere-era attention kernel (FlashAttention-2) on the GPUs listed (None: every GPU),
# recognised in a record's `source` when `job.attention_kernel` is not stated.
FLASH2_FRAMEWORKS: dict[str, tuple[str, frozenset[str] | None]] = {
    "llm-foundry": ("llm-foundry's MPT benchmarks ran FlashAttention-2/Triton attention", None),
    "torchtitan": (
        "torchtitan's SDPA takes PyTorch's FlashAttention-2 backend before Blackwell (torchtitan PR #1196)",
        frozenset({"ampere", "hopper"}),
    ),
}


class RunLayout(BaseModel):
    """A layout as published: any field may be null (not published)."""

    model_config = ConfigDict(extra="forbid")

    tp: int | None = Field(None, ge=1)
    pp: int | None = Field(None, ge=1)
    cp: int | None = Field(None, ge=1)
    dp: int | None = Field(None, ge=1)
    vp: int | None = Field(None, ge=1)
    micro_batch: int | None = Field(None, ge=1)
    sharding: str | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None

    def known(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def unknown(self) -> list[str]:
        return [k for k, v in self.model_dump().items() if v is None]


class Measured(BaseModel):
    model_config = ConfigDict(extra="allow")

    tokens_per_s_per_gpu: float = Field(gt=0)
    derived_from: str = "tokens_per_s"


class RunRecord(BaseModel):
    """One measured training run."""

    model_config = ConfigDict(extra="allow")

    id: str
    source: str = ""
    model: ModelSpec
    cluster: ClusterSpec
    job: RunJob
    layout: RunLayout
    measured: Measured
    hardware_note: str | None = None

    def attention_kernel(self) -> tuple[AttentionKernel, str | None]:
        """The attention kernel the run used, and why it was assumed (None when the record states it)."""
        if self.job.attention_kernel is not None:
            return self.job.attention_kernel, None
        for name, (why, archs) in FLASH2_FRAMEWORKS.items():
            if name in self.source.lower() and (archs is None or gpu_preset(self.cluster.gpu).arch in archs):
                return "flash2", f"from the source: {why}"
        return "flash", "not stated: the GPU's native fused kernel"

    @property
    def group_key(self) -> tuple[object, ...]:
        """Runs sharing model, cluster and job, differing only in layout, are ranked against each other."""
        return (self.model.name, self.cluster.gpu, self.cluster.gpus, self.job.seq_len, self.job.global_batch,
                self.job.precision, self.attention_kernel()[0])  # fmt: skip


def _record(raw: dict[str, Any], where: str) -> RunRecord:
    model = raw.get("model")
    if isinstance(model, dict):  # the record format writes null for "not stated"
        raw = raw | {"model": {k: v for k, v in model.items() if v is not None}}
    try:
        return RunRecord.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise InputError(describe_validation_error(exc, where)) from None


def _undot(row: Mapping[str | None, str | None]) -> dict[str, Any]:
    """CSV columns `model.hidden`, `layout.tp`, ... -> nested dict; empty cells are null."""
    out: dict[str, Any] = {}
    for key, text in row.items():
        if key is None:
            continue
        value: Any = None if text is None or text.strip() == "" or text.strip().lower() == "null" else text.strip()
        if isinstance(value, str):
            value = value.lower() == "true" if value.lower() in ("true", "false") else _number(value)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def read_runs(path: str | Path) -> list[RunRecord]:
    """Read run records from a `.jsonl`/`.json` or `.csv` file; errors name the line and field."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"runs: no such file {str(path)!r}")
    text = path.read_text()
    records: list[RunRecord] = []
    if path.suffix.lower() == ".csv":
        for i, row in enumerate(csv.DictReader(text.splitlines()), start=2):
            records.append(_record(_undot(row), f"{path.name} line {i}"))
    else:
        stripped = text.lstrip()
        if stripped.startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(f"runs: {path.name} is not valid JSON ({exc.msg})") from None
            records = [_record(item, f"{path.name} item {i}") for i, item in enumerate(items)]
        else:
            for i, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"runs: {path.name} line {i} is not valid JSON ({exc.msg})") from None
                records.append(_record(raw, f"{path.name} line {i}"))
    if not records:
        raise InputError(f"runs: {path.name} holds no run records")
    return records
