"""Fused GPU kernels (Triton), each with a torch reference and a test against it.

On CPU the torch reference runs; tests run the Triton kernels under TRITON_INTERPRET=1.
"""
