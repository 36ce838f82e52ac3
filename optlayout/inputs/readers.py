"""One reader per kind of file optlayout reads: its name in errors, its size limit, and how its text is parsed.

    kind.text(path)   bytes (at most kind.max_bytes) -> UTF-8 text
    kind.yaml(path)   -> one YAML document (no duplicate keys, aliases bounded, depth-limited)
    kind.json(path)   -> one strict JSON document (no NaN/Infinity, no duplicate keys, depth-limited)

The documents then go through their pydantic models (finite numbers, strict integers, bounded sizes): the
topology schema, ModelSpec, RunRecord, Plan, Calibration. Traces are streamed (`optlayout.trace`) and logs are
read line by line from the text, each with its own checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optlayout.inputs.files import read_text
from optlayout.inputs.json_doc import parse_json
from optlayout.inputs.limits import MIB
from optlayout.inputs.yaml_doc import parse_yaml


@dataclass(frozen=True)
class FileKind:
    """A kind of input file: `what` starts its errors ("topology: no such file ...")."""

    what: str
    max_bytes: int

    def where(self, path: str | Path) -> str:
        return f"{self.what} {Path(path).name}"

    def text(self, path: str | Path) -> str:
        return read_text(path, self.what, self.max_bytes)

    def yaml(self, path: str | Path) -> Any:
        return parse_yaml(self.text(path), self.where(path))

    def json(self, path: str | Path) -> Any:
        return parse_json(self.text(path), self.where(path))


TOPOLOGY = FileKind("topology", 128 * MIB)  # a 131,072-GPU explicit topology is about 40 MB
MODEL_CONFIG = FileKind("model-config", 8 * MIB)
GPU_FILE = FileKind("gpu file", 8 * MIB)  # OPTLAYOUT_GPU_FILE: a few GPU rows  # Hugging Face config.json: a few kB
PLAN = FileKind("plan", 64 * MIB)
CALIBRATION = FileKind("calibration", 8 * MIB)
RUNS = FileKind("runs", 512 * MIB)  # 20,000 records are about 20 MB
LOG = FileKind("log", 512 * MIB)
NVIDIA_SMI = FileKind("nvidia-smi", 8 * MIB)
NCCL_XML = FileKind("nccl-xml", 64 * MIB)
SLURM = FileKind("slurm", 64 * MIB)
DISCOVERY = {"nvidia-smi": NVIDIA_SMI, "nccl-xml": NCCL_XML, "slurm": SLURM}
