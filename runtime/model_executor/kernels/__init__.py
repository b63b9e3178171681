"""Kernels this project writes itself, built on the machine that runs them (cpu: the fused CPU layer kernels)."""
