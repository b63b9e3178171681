"""The compiler passes, one module each, in pipeline order (see `mstar_compiler.pipeline`)."""
