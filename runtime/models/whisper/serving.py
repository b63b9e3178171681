"""What Whisper adds to the server (runtime/entrypoints/http/families.py): its own answer to
/v1/audio/transcriptions and /v1/audio/translations."""
from __future__ import annotations

from runtime.entrypoints.http.families import FamilyServing
from runtime.models.whisper.transcribe import transcriber

SERVING = FamilyServing(frozenset({"whisper_decoder"}), transcriber=transcriber)
