"""mstar runtime: serves a compiled plan (plan.bin) over HTTP with a conductor and workers."""
