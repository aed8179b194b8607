"""SVG reconstruction (VAGEN's SVG env): untrusted SVG rendered within limits (render.py), and
how alike two renders are (score.py)."""
