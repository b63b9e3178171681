"""Whisper (runtime/models/whisper/): the encoder, the decoder whose paged KV holds its cross-attention
memory, their executors, the special-token layout, and the transcription endpoints' answer."""
