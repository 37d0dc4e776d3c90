"""Whisper tiny.en on the CPU: our cpu backend vs transformers (PyTorch eager), 2 threads, one process.

    python bench/whisper.py [decoder] [encoder] [clips] [notorch]     # default: all three, with torch
Reports (1) the decoder per token: 32 greedy steps with the KV cache from an empty cache, ours
(`decode_greedy`: step + Whisper's filters + argmax, the cache written in place; fp32 and int8) vs
transformers' decoder + proj_out + argmax with a EncoderDecoderCache (its first step computes the cross K/V, which
ours did in `encode`: ~0.5 ms of its per-step figure) vs ONNX Runtime on a torch export of a cached decoder step
(`CachedStep` below: static self-attention cache in, updated cache out, cross K/V in; argmax on the host), run as
a plain ORT user would, numpy in and out; (2) a 30 s window through the encoder and every decoder layer's
cross-attention K/V projections, what our `encode` entry computes (fp32 and int8); (3) transcribing
the 5 LibriVox clips (features + encoder + greedy decoding with timestamps and temperature fallback) with the same
tiny.en weights: ours `WhisperRecognizer.transcribe` (fp32; --precision int8, the entries its WER gate allows;
every entry in int8) vs faster-whisper (CTranslate2, the same model.bin, fp32 and int8, beam_size=1 as ours; and
beam_size=5, its default, which a user of it gets) vs
transformers' WhisperFeatureExtractor + `generate(return_timestamps=True)`, with each one's WER.
Needs the `reference` extra (torch, transformers, onnxruntime, onnx, faster-whisper) and Debian's
pocketsphinx-testdata.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import sys

from harness import THREADS, compare, onnx_session, print_table, scratch, threads, torch_threads

threads(2)

import numpy as np  # noqa: E402

from pipelines.asr import WhisperRecognizer  # noqa: E402
from pipelines.audio import load_audio, whisper_log_mel  # noqa: E402
from sdk.models import whisper  # noqa: E402
from tests.test_transcribe import wer  # noqa: E402  (the suite's WER: same normalisation)

CLIPS = sorted(Path("/usr/share/pocketsphinx/test/data/librivox").glob("*.wav"))
STEPS = 32


def hf_model(t: WhisperRecognizer):
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration
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


def cached_step(model, n_ctx: int):
    """transformers' Whisper decoder as one cached step over a static cache: what an ONNX export of the decoder
    looks like without the optimum exporter (its EncoderDecoderCache is an object, not tensors)."""
    import torch
    decoder, H = model.model.decoder, model.config.decoder_attention_heads

    def heads(t):
        return t.view(1, -1, H, t.shape[-1] // H).transpose(1, 2)

    def attend(q, k, v, mask=None):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(scores if mask is None else scores + mask, dim=-1) @ v

    class CachedStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = decoder  # a submodule: its weights export as initializers

        def forward(self, token, pos, self_k, self_v, cross_k, cross_v):
            # token [1, 1]; pos [1]; self_k/v [layers, 1, H, n_ctx, D]; cross_k/v [layers, 1, H, 1500, D]
            x = decoder.embed_tokens(token) + decoder.embed_positions.weight[pos][None]
            here = (torch.arange(n_ctx) == pos).view(1, 1, n_ctx, 1)
            mask = torch.where(torch.arange(n_ctx) <= pos, 0.0, float("-inf"))
            new_k, new_v = [], []
            for i, layer in enumerate(decoder.layers):
                a = layer.self_attn
                h = layer.self_attn_layer_norm(x)
                k = torch.where(here, heads(a.k_proj(h)), self_k[i])
                v = torch.where(here, heads(a.v_proj(h)), self_v[i])
                new_k.append(k), new_v.append(v)
                x = x + a.out_proj(attend(heads(a.q_proj(h)), k, v, mask).transpose(1, 2).reshape(1, 1, -1))
                c = layer.encoder_attn
                h = layer.encoder_attn_layer_norm(x)
                x = x + c.out_proj(attend(heads(c.q_proj(h)), cross_k[i], cross_v[i]).transpose(1, 2).reshape(1, 1, -1))
                h = layer.final_layer_norm(x)
                x = x + layer.fc2(torch.nn.functional.gelu(layer.fc1(h)))
            logits = decoder.layer_norm(x) @ decoder.embed_tokens.weight.T
            return logits, torch.stack(new_k), torch.stack(new_v)
    return CachedStep().eval()


def main():
    torch = torch_threads()
    from transformers import DynamicCache, EncoderDecoderCache, WhisperFeatureExtractor
    sections = sys.argv[1:] or ["decoder", "encoder", "clips"]
    from pipelines.asr import TranscribeOptions
    ours = WhisperRecognizer("whisper-tiny.en", device="cpu")
    ours_int8 = WhisperRecognizer("whisper-tiny.en", device="cpu", options=TranscribeOptions(precision="int8"))
    # every entry in int8, the WER gate's verdict aside (sdk.models.whisper.INT8_ENTRIES): what int8 does to each
    # entry's time, and the like of faster-whisper's int8, which quantizes the whole model
    gated = whisper.INT8_ENTRIES
    whisper.INT8_ENTRIES = ("encode", *gated)
    all_int8 = WhisperRecognizer("whisper-tiny.en", device="cpu", options=TranscribeOptions(precision="int8"))
    whisper.INT8_ENTRIES = gated
    model = hf_model(ours)
    fe = WhisperFeatureExtractor(feature_size=80)
    audio = [load_audio(c) for c in CLIPS]
    seconds = sum(len(a) for a in audio) / 16000
    mel = whisper_log_mel(audio[0])[None]
    state = ours.state
    for r in (ours, all_int8):
        r.session.run("encode", r.state, mel=mel)
    with torch.no_grad():
        enc = model.model.encoder(torch.from_numpy(mel)).last_hidden_state

    def ours_steps(r=ours):
        tokens = [ours.tokenizer.sot]
        for pos in range(STEPS):
            out = r.session.run("decode_greedy", r.state, tokens=np.array([[tokens[-1]]], np.int32), pos=pos,
                                first=0, lo1=0, hi1=ours.cfg.vocab_size, lo2=0, hi2=0)  # no filters: argmax
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
        cfg, L = ours.cfg, ours.cfg.decoder_layers
        cross = {n: np.stack([state.buffers[f"{n}.{i}"] for i in range(L)]) for n in ("cross_k", "cross_v")}
        empty = np.zeros((L, *state.buffers["self_k.0"].shape), np.float32)
        step = cached_step(model, cfg.max_target_positions)
        path = scratch(".onnx")
        with torch.no_grad():
            torch.onnx.export(step, (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                                     *(torch.from_numpy(a) for a in (empty, empty, cross["cross_k"], cross["cross_v"]))),
                              path, input_names=["token", "pos", "self_k", "self_v", "cross_k", "cross_v"],
                              output_names=["logits", "new_k", "new_v"], dynamo=False, opset_version=17)
        ort = onnx_session(path)

        def ort_steps():
            tokens, k, v = [ours.tokenizer.sot], empty, empty
            for pos in range(STEPS):
                logits, k, v = ort.run(None, {"token": np.array([[tokens[-1]]], np.int64), "pos": np.array([pos]),
                                              "self_k": k, "self_v": v, **cross})
                tokens.append(int(logits[0, -1].argmax()))
            return tokens

        print(f"  (check: the same {STEPS} greedy tokens: ours = torch {ours_steps() == torch_steps()}, "
              f"ours = onnxruntime {ours_steps() == ort_steps()}, ours int8 = ours "
              f"{ours_steps(all_int8) == ours_steps()})")
        print_table(f"decoder, {STEPS} greedy steps from an empty cache (per step)",
                    {k: [t / STEPS for t in v] for k, v in compare(
                        {"ours": ours_steps, "ours, int8": lambda: ours_steps(all_int8),
                         "onnxruntime": ort_steps, "torch": torch_steps}).items()})

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

    def ours_encode(r=ours):
        return r.session.run("encode", r.state, mel=mel)["encoder"]

    def torch_encode():
        with torch.no_grad():
            encoder_and_kv(torch.from_numpy(mel))

    if "encoder" in sections:
        path = scratch(".onnx")
        with torch.no_grad():
            torch.onnx.export(encoder_and_kv, (torch.from_numpy(mel),), path, input_names=["mel"],
                              dynamo=False, opset_version=17)  # the exporter wants tensors in and out
        ort = onnx_session(path)

        def ort_encode():
            return ort.run(None, {"mel": mel})[0]

        ours_out, int8_out = ours_encode(), ours_encode(all_int8)
        print(f"  (check: max-abs ours vs onnxruntime encoder {np.abs(ours_out - ort_encode()).max():.2e}; ours int8 "
              f"vs ours rel-L2 {np.linalg.norm(int8_out - ours_out) / np.linalg.norm(ours_out):.2e})")
        print_table("encoder and the decoder's cross-attention K/V, one 30 s window",
                    compare({"ours": ours_encode, "ours, int8": lambda: ours_encode(all_int8),
                             "torch": torch_encode, "onnxruntime": ort_encode}, min_blocks=3))

    def ours_clips(recognizer=ours):
        return [recognizer.transcribe(a).text for a in audio]

    def torch_clips():
        out = []
        with torch.no_grad():
            for a in audio:
                feats = torch.from_numpy(fe(a, sampling_rate=16000, return_tensors="np").input_features)
                ids = model.generate(feats, return_timestamps=True)[0].tolist()
                out.append(ours.tokenizer.decode(ids).strip())
        return out

    def faster_whisper(compute_type: str, beam_size: int = 1):
        from faster_whisper import WhisperModel
        fw = WhisperModel(str(ours.source.path), device="cpu", compute_type=compute_type, cpu_threads=THREADS)

        def run():  # with temperature fallback and timestamps, as ours; beam_size 1: greedy, as ours
            return [" ".join(s.text.strip() for s in fw.transcribe(a, language="en", beam_size=beam_size,
                                                                   vad_filter=False)[0])
                    for a in audio]
        return run

    if "clips" not in sections:
        return
    # tiny.en's default is the full window (pipelines.whisper_asr.SHORTEST_WINDOW): this row shows what a 15 s one buys
    ours_15s = WhisperRecognizer("whisper-tiny.en", device="cpu", options=TranscribeOptions(shortest_window=15.0))
    cases = {"ours": ours_clips, "ours --precision int8": lambda: ours_clips(ours_int8),
             "ours, every entry int8": lambda: ours_clips(all_int8),
             "ours, 15 s encoder window": lambda: ours_clips(ours_15s),
             "faster-whisper fp32": faster_whisper("float32"),
             "faster-whisper int8": faster_whisper("int8"),
             "faster-whisper fp32, beam 5 (its default)": faster_whisper("float32", 5),
             "faster-whisper int8, beam 5 (its default)": faster_whisper("int8", 5), "torch": torch_clips}
    if "notorch" in sections:
        del cases["torch"]
    for name, fn in cases.items():
        texts = dict(zip((c.stem for c in CLIPS), fn()))
        rate, errors, words = wer(texts)
        print(f"  WER {name}: {rate:.1%} ({errors}/{words})")
    rounds = int(os.environ.get("ROUNDS", 3))  # every round, however slow the machine: n is the rounds asked for
    stats = compare(cases, warmup=0, min_blocks=rounds, block_s=0.0, max_s=float("inf"))
    med = print_table(f"5 LibriVox clips ({seconds:.1f} s of audio), whole transcription", stats, unit=1, unit_name="s")
    for name, m in med.items():
        print(f"  real-time factor {name}: {m / seconds:.3f}")


if __name__ == "__main__":
    main()
