"""Example mstar plugin: the `audio_gain` family (its declaration, catalogue.py; its torch module, component.py;
its executor, executor.py)."""
