"""Evaluation: probes on frozen features (linear, k-NN, attentive) and encoding datasets to latents.

Library code: no click, no printing. Heavy imports (JAX) happen inside the modules, not here.
"""
