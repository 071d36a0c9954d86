"""Exporting a trained policy (data transformers, statistics frozen, and the algorithm's greedy action) as one program
of tensors in, tensors out: ``torch.export`` (``.pt2``) or ONNX. The command is ``alfish.bin.export``."""
