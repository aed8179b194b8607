"""Install-time tools, run by the Makefile: ``patch_torchvision`` (makes PyPI's CUDA torchvision
importable against CPU torch) and ``system.sh`` (the root-only Debian packages). Imported by
nothing of the run.
"""
