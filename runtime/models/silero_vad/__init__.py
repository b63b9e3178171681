"""Silero VAD as a graph node (`silero_vad`, mstar_compiler/catalogue/silero_vad.py): the published v6
model restated in torch (`silero_vad.py`), its executor keeping each request's LSTM state and audio
context from chunk to chunk, so a session's stream of windows is heard as one continuous signal."""
