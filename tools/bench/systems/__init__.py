"""The systems tools/bench's comparison starts and measures (tools/bench/compare.py)."""
