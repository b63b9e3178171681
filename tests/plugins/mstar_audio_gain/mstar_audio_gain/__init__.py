"""Example mstar plugin: the `audio_gain` component kind (catalogue entry + torch module)."""
