"""Live dictation: audio in, `partial` and `final` text out, while the person is still talking.

    from pipelines.asr import Transcriber
    from pipelines.dictation import Stream, Microphone

    with Stream(lambda: Transcriber("whisper-tiny.en"), Microphone("usb")) as stream:
        for event in stream.events():          # Partial / Final / State, until stop() or the source ends
            print(event)

How it works, in the order audio flows:
  source (Microphone, FileSource, or `feed()` from the app) -> resampled to 16 kHz -> RingBuffer
  -> worker thread: Recognizer = VAD (energy over an adaptive noise floor + a voicing check, or with
  vad="silero" silero-vad's model on ONNX Runtime) that cuts utterances with pre-roll and hangover ->
  the utterance, after up to 6 s of the audio before it as left context (tiny models transcribe short
  isolated utterances worse; the context's own text is recognised as a repeat of the recent finals and
  dropped), all within one 30 s encoder window, is re-decoded every
  `partial_every` seconds (less often when decoding is slow); words two consecutive decodes agree on are
  stable (LocalAgreement-2) ->
  at the utterance end one last decode becomes the `final`. It starts after `early_final` s of quiet, before
  the hangover has confirmed the end (if the talker goes on, it was one more partial); a partial that
  started in the final pause is the final itself. When the model was sure of every word of it
  (`commit_logprob`), it goes out after `commit_quiet` s of quiet, before the hangover (a talker who goes on
  within the hangover continues the utterance after the emitted words); else it waits for the hangover. Partials start in pauses for that reason: a decode cannot
  be interrupted, so the final waits for one only when the talker stops while a decode that missed the
  last words is running. Utterances longer than `commit_after` seconds are committed early at an agreed
  segment boundary and the window slides on, so long speech never overflows the encoder window.

Against Whisper's known failure modes: no text from one window is fed to the next (no prompt carry-over,
the classic source of loops); stretches the VAD calls loud but that carry no voiced frames (noise, clicks)
are never decoded; segments Whisper itself marks as non-speech are dropped; repeated n-grams are collapsed.

Audio captured before the model is ready waits in the ring buffer and is transcribed once it is (the
states are loading -> warming -> ready -> listening -> stopped). A failing microphone stops capture, the
audio already captured is still transcribed (with no `listening` if it failed before that), then the typed
error is raised; `unprocessed_audio()` returns what could not be transcribed (for instance when the model is
missing) so an app can save it.

Times in events are seconds of audio since the stream started ("audio time").
"""
from __future__ import annotations

from .devices import InputDevice, find_input_device, list_input_devices
from .events import Event, Final, Partial, State
from .file_source import FileSource
from .microphone import Microphone
from .options import FRAME, FRAME_SECONDS, SAMPLE_RATE, WINDOW_SECONDS, DictationOptions
from .recognizer import Recognizer
from .ring_buffer import RingBuffer
from .silero_vad import SileroVad
from .stream import Stream
from .text_guards import collapse_repeats
from .vad import Vad
from .voice_activity import VadFallbackWarning

__all__ = ["DictationOptions", "Event", "FileSource", "Final", "FRAME", "FRAME_SECONDS", "InputDevice", "Microphone",
           "Partial", "Recognizer", "RingBuffer", "SAMPLE_RATE", "SileroVad", "State", "Stream", "Vad",
           "VadFallbackWarning", "WINDOW_SECONDS", "collapse_repeats", "find_input_device", "list_input_devices"]
