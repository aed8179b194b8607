"""launch.tools.patch_torchvision: the source rewrite guards exactly the unguarded fake kernels and is
idempotent; the installed torchvision imports (the install step has run the patch)."""

import importlib.util
import subprocess
import sys

import pytest

from launch.tools.patch_torchvision import ANCHOR, MARKER, patched_source

SOURCE = f'''import torch
{ANCHOR}

@register_meta("roi_align")
def meta_roi_align(input):
    return input


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets


@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    return dets
'''


def test_patch_guards_unguarded_registrations_once():
    once = patched_source(SOURCE)
    assert MARKER in once
    assert "@torch.library.register_fake(" not in once
    assert once.count('@_register_fake_if_has_ops("torchvision::') == 2
    assert '@register_meta("roi_align")' in once
    assert patched_source(once) == once
    compile(once, "_meta_registrations.py", "exec")


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision not installed")
def test_installed_torchvision_imports():
    subprocess.run([sys.executable, "-c", "import torchvision.transforms.v2.functional"], check=True)
