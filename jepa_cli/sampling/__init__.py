"""Samplers for the generative objectives (flow matching, diffusion): sampler.py holds the jitted
trajectories with classifier-free guidance in an interval; run.py samples a training run to a dataset."""
