"""Which Megatron-Core releases define each flag the Megatron emitter writes: the fixture that
tests/test_megatron_core.py checks `optlayout.layout.megatron_core.FLAG_SINCE` against.

Reproduce:  python benchmarks/megatron_flag_releases.py --megatron-lm GITDIR [--write]
GITDIR is a Megatron-LM git directory (a clone, or `fetch github:NVIDIA/Megatron-LM`); for every release tag from
0.6.0 to 0.15.0 (core_v, else core_r) it reads `megatron/training/arguments.py` and lists which of the flags the
emitter source names it defines (`'--flag'` as add_argument writes it). From 0.16.0 many flags are generated from
the config dataclasses (`ArgumentGroupFactory`), which text cannot read: `benchmarks/megatron_lm_args.py` runs
that parser itself. `--write` replaces
tests/fixtures/megatron_flag_releases.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMITTER = ROOT / "optlayout" / "emit" / "megatron.py"
FIXTURE = ROOT / "tests" / "fixtures" / "megatron_flag_releases.json"
RELEASES = tuple(f"0.{minor}.0" for minor in range(6, 16))


def tag_of(gitdir: Path, release: str) -> str:
    for tag in (f"core_v{release}", f"core_r{release}"):
        if subprocess.run(["git", "--git-dir", str(gitdir), "rev-parse", "-q", "--verify", f"refs/tags/{tag}"],
                          capture_output=True).returncode == 0:  # fmt: skip
            return f"refs/tags/{tag}"
    raise SystemExit(f"no tag for Megatron-Core {release} in {gitdir}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, required=True, help="Megatron-LM git directory")
    parser.add_argument("--write", action="store_true", help=f"write {FIXTURE.relative_to(ROOT)}")
    opts = parser.parse_args()
    flags = sorted(set(re.findall(r'"(--[a-z0-9-]+)"', EMITTER.read_text())) - {"--"})
    releases: dict[str, list[str]] = {flag: [] for flag in flags}
    tags = {}
    for release in RELEASES:
        tags[release] = tag_of(opts.megatron_lm, release).removeprefix("refs/tags/")
        source = subprocess.run(["git", "--git-dir", str(opts.megatron_lm), "show",
                                 f"{tags[release]}:megatron/training/arguments.py"],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        for flag in flags:
            if f"'{flag}'" in source or f'"{flag}"' in source:
                releases[flag].append(release)
    out = {"source": "NVIDIA/Megatron-LM megatron/training/arguments.py at the tags", "tags": tags,
           "releases": releases}  # fmt: skip
    text = json.dumps(out, indent=1) + "\n"
    if opts.write:
        FIXTURE.write_text(text)
    print(text if not opts.write else f"wrote {FIXTURE.relative_to(ROOT)}: {len(flags)} flags x {len(tags)} tags")


if __name__ == "__main__":
    main()
