"""Whisper tiny.en on the CPU: our cpu backend vs transformers (PyTorch eager), 2 threads, one process.

    python bench/whisper.py [decoder] [encoder] [clips]     # default: all three
Reports (1) the decoder per token: 32 greedy steps with the KV cache from an empty cache, ours
(`decode_greedy`: step + Whisper's filters + argmax) vs transformers' decoder + proj_out + argmax with a
EncoderDecoderCache (its first step computes the cross K/V, which ours did in `encode`: ~0.5 ms of its per-step
figure); (2) a 30 s window through the encoder and every decoder layer's cross-attention K/V projections, what
our `encode` entry computes; (3) the real-time factor of transcribing the 5 LibriVox clips
(features + encoder + greedy decoding with timestamps), ours `WhisperRecognizer.transcribe` vs transformers'
WhisperFeatureExtractor + `generate(return_timestamps=True)`. ONNX Runtime runs the encoder (exported with
torch.onnx); it is not in the decoder rows: exporting Whisper's cached decoder step needs the optimum
exporter, which is not installed here.
Needs the `reference` extra (torch, transformers, onnxruntime, onnx) and Debian's pocketsphinx-testdata.
"""
from __future__ import annotations

import json
from pathlib import Path

import sys

from harness import compare, onnx_session, print_table, threads, torch_threads

threads(2)

import numpy as np  # noqa: E402

from pipelines.asr import WhisperRecognizer  # noqa: E402
from pipelines.audio import load_audio, whisper_log_mel  # noqa: E402

CLIPS = sorted(Path("/usr/share/pocketsphinx/test/data/librivox").glob("*.wav"))
STEPS = 32


def hf_model(t: WhisperRecognizer):
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration
    from sdk.models import whisper
    cfg, weights = whisper.load(t.source.path)
    tok = t.tokenizer
    model = WhisperForConditionalGeneration(WhisperConfig(**cfg.__dict__, decoder_start_token_id=tok.sot,
                                                          pad_token_id=tok.eot, eos_token_id=tok.eot)).eval()
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    model.load_state_dict(state | {"proj_out.weight": state["model.decoder.embed_tokens.weight"]})
    config = json.loads((t.source.path / "config.json").read_text())
    model.generation_config = GenerationConfig(
        decoder_start_token_id=tok.sot, eos_token_id=tok.eot, pad_token_id=tok.eot, bos_token_id=tok.sot,
        suppress_tokens=config["suppress_ids"], begin_suppress_tokens=config["suppress_ids_begin"],
        no_timestamps_token_id=tok.no_timestamps, max_initial_timestamp_index=50, is_multilingual=False,
        max_length=448)
    return model


def main():
    torch = torch_threads()
    from transformers import DynamicCache, EncoderDecoderCache, WhisperFeatureExtractor
    sections = sys.argv[1:] or ["decoder", "encoder", "clips"]
    ours = WhisperRecognizer("whisper-tiny.en", device="cpu")
    model = hf_model(ours)
    fe = WhisperFeatureExtractor(feature_size=80)
    audio = [load_audio(c) for c in CLIPS]
    seconds = sum(len(a) for a in audio) / 16000
    mel = whisper_log_mel(audio[0])[None]
    s, state = ours.session, ours.state
    s.run("encode", state, mel=mel)
    with torch.no_grad():
        enc = model.model.encoder(torch.from_numpy(mel)).last_hidden_state

    def ours_steps():
        tokens = [ours.tokenizer.sot]
        for pos in range(STEPS):
            out = s.run("decode_greedy", state, tokens=np.array([[tokens[-1]]], np.int32), pos=pos, first=0,
                        lo1=0, hi1=ours.cfg.vocab_size, lo2=0, hi2=0)  # no filters: plain argmax, as torch
            tokens.append(int(out["token"][0]))
        return tokens

    def torch_steps():
        cache, tokens = EncoderDecoderCache(DynamicCache(), DynamicCache()), [ours.tokenizer.sot]
        with torch.no_grad():
            for _ in range(STEPS):
                h = model.model.decoder(input_ids=torch.tensor([[tokens[-1]]]), encoder_hidden_states=enc,
                                        cache=cache, use_cache=True).last_hidden_state
                tokens.append(int(model.proj_out(h)[0, -1].argmax()))
        return tokens

    if "decoder" in sections:
        print(f"  (check: the same {STEPS} greedy tokens: {ours_steps() == torch_steps()})")
        med = print_table(f"decoder, {STEPS} greedy steps from an empty cache (per step)",
                          {k: [t / STEPS for t in v]
                           for k, v in compare({"ours": ours_steps, "torch": torch_steps}).items()})
        print(f"  (transformers ~19.6 ms/token measured earlier on this machine; ours {med['ours'] * 1e3:.1f})")

    class EncoderAndCrossKV(torch.nn.Module):
        """What our `encode` entry computes: the encoder, then every decoder layer's cross-attention K and V
        (transformers computes them on the first decoder step and caches them)."""
        def __init__(self):
            super().__init__()
            self.encoder = model.model.encoder
            self.cross = torch.nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)

        def forward(self, features):
            h = self.encoder(features).last_hidden_state
            return (h, *(proj(h) for attn in self.cross for proj in (attn.k_proj, attn.v_proj)))

    encoder_and_kv = EncoderAndCrossKV().eval()

    def ours_encode():
        s.run("encode", state, mel=mel)

    def torch_encode():
        with torch.no_grad():
            encoder_and_kv(torch.from_numpy(mel))

    if "encoder" in sections:
        import tempfile

        path = tempfile.mktemp(suffix=".onnx")
        with torch.no_grad():
            torch.onnx.export(encoder_and_kv, (torch.from_numpy(mel),), path, input_names=["mel"],
                              dynamo=False, opset_version=17)  # the exporter wants tensors in and out
        ort = onnx_session(path)

        def ort_encode():
            return ort.run(None, {"mel": mel})[0]

        ours_out = s.run("encode", state, mel=mel)["encoder"]
        print(f"  (check: max-abs ours vs onnxruntime encoder {np.abs(ours_out - ort_encode()).max():.2e})")
        print_table("encoder and the decoder's cross-attention K/V, one 30 s window",
                    compare({"ours": ours_encode, "torch": torch_encode, "onnxruntime": ort_encode}, min_blocks=3))

    def ours_clips():
        return [ours.transcribe(a).text for a in audio]

    def torch_clips():
        out = []
        with torch.no_grad():
            for a in audio:
                feats = torch.from_numpy(fe(a, sampling_rate=16000, return_tensors="np").input_features)
                ids = model.generate(feats, return_timestamps=True)[0].tolist()
                out.append(ours.tokenizer.decode(ids).strip())
        return out

    if "clips" not in sections:
        return
    same = ours_clips() == torch_clips()
    stats = compare({"ours": ours_clips, "torch": torch_clips}, warmup=0, min_blocks=2, block_s=0.0)
    med = print_table(f"5 LibriVox clips ({seconds:.1f} s of audio), whole transcription", stats, unit=1, unit_name="s")
    for name, m in med.items():
        print(f"  real-time factor {name}: {m / seconds:.3f}")
    print(f"  transcripts identical: {same}")


if __name__ == "__main__":
    main()
