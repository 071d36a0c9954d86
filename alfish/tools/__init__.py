"""Analysis tools for alfish results directories, each runnable as ``python -m alfish.tools.<name>`` (or
``python tools/<name>.py``):

- ``plot``: learning curves of one or more runs (groups of seeds: mean with a band, or IQM with a bootstrap CI) to a
  PNG/SVG file (needs matplotlib: ``pip install 'alfish[plot]'``).
- ``compare``: a table of runs: final and best evaluation return, env steps to a threshold, env steps/s, wall-clock.
- ``verify_checkpoint``: verifies checkpoints against their manifests and says what each holds.

A results directory is untrusted input: these tools read JSON, TensorBoard event files and tensors
(``torch.load(weights_only=True)``) only, execute nothing from it, and write nothing into it.
Shared parts: ``runs`` (finding runs and reading their curves), ``stats`` (aligning seeds, bands, IQM, bootstrap).
"""
