"""Conformer encoders on the CPU: our cpu backend vs PyTorch eager (the reference module) vs ONNX Runtime (the same
module exported), batch 1, 2 threads, reported as encoder milliseconds per second of audio. Every contender is given
the audio's length and masks by it, as a batch of padded windows needs.

    python bench/conformer.py            # FastConformer-110M shape (parakeet-tdt_ctc-110m), random weights
    python bench/conformer.py --model gigaam-v2   # GigaAM-v2 encoder shape (gigaam package), random weights
    python bench/conformer.py --seconds 5 --threads 1   # 1 thread is steadier on a busy 2-core machine
Needs the `reference` extra (torch, transformers, onnxruntime, onnx; gigaam installed --no-deps for gigaam-v2).
The graph is the same one ConformerRecognizer runs per window.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

from harness import compare, onnx_session, print_table, scratch, threads, torch_threads

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=("fastconformer-110m", "gigaam-v2"), default="fastconformer-110m")
parser.add_argument("--seconds", type=float, default=10.0, help="audio per encoder run")
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()
threads(args.threads)  # before numpy and torch load their thread pools

import numpy as np  # noqa: E402

from sdk.models import conformer  # noqa: E402
from sdk.session import Session  # noqa: E402

# FastConformer-110M (e.g. nvidia/parakeet-tdt_ctc-110m): 17 layers, d 512, 8 heads, FF 2048, conv kernel 9,
# 8x depthwise-striding subsampling with 256 channels, 80 mels.
FASTCONFORMER_110M = dict(hidden_size=512, num_hidden_layers=17, num_attention_heads=8, intermediate_size=2048,
                          conv_kernel_size=9, subsampling_conv_channels=256, num_mel_bins=80,
                          dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0)
# GigaAM-v2 (ctc / rnnt): 16 layers, d 768, 16 heads, FF 3072, conv kernel 31, rotary attention, 4x striding, 64 mels.
GIGAAM_V2 = dict(feat_in=64, n_layers=16, d_model=768, subsampling_factor=4, ff_expansion_factor=4,
                 self_attention_model="rotary", n_heads=16, pos_emb_max_len=5000, conv_kernel_size=31)


def fastconformer(torch, folder: str):
    """(torch module (features [1, T, mels], length [1]) -> [1, T', d], checkpoint written to folder)."""
    import transformers
    hf = transformers.ParakeetForCTC(transformers.ParakeetCTCConfig(
        vocab_size=1025, pad_token_id=1024, encoder_config=FASTCONFORMER_110M)).eval()
    hf.save_pretrained(folder, safe_serialization=True)

    class Encoder(torch.nn.Module):  # the exporter wants tensors in, tensors out
        def __init__(self):
            super().__init__()
            self.encoder = hf.encoder

        def forward(self, input_features, length):  # masked by length, as ours is: the same work
            mask = torch.arange(input_features.shape[1])[None, :] < length[:, None]
            return self.encoder(input_features=input_features, attention_mask=mask.long()).last_hidden_state
    return Encoder().eval()


def gigaam(torch, folder: str):
    from safetensors.torch import save_file
    if "gigaam" not in sys.modules:  # its __init__ needs hydra and torchaudio: load the submodules only
        pkg = types.ModuleType("gigaam")
        pkg.__path__ = list(importlib.util.find_spec("gigaam").submodule_search_locations)
        sys.modules["gigaam"] = pkg
    encoder = importlib.import_module("gigaam.encoder").ConformerEncoder(**GIGAAM_V2).eval()
    with torch.no_grad():
        for name, p in encoder.named_parameters():
            if name.endswith(("pos_bias_u", "pos_bias_v")):
                p.normal_(0, 0.02)
    head = {"feat_in": GIGAAM_V2["d_model"], "num_classes": 34}  # conformer.load wants a head: a zero CTC one
    ckpt = {f"encoder.{k}": v.contiguous() for k, v in encoder.state_dict().items()}
    ckpt |= {"head.decoder_layers.0.weight": torch.zeros(34, GIGAAM_V2["d_model"], 1),
             "head.decoder_layers.0.bias": torch.zeros(34)}
    save_file(ckpt, str(Path(folder) / "model.safetensors"))
    (Path(folder) / "config.json").write_text(json.dumps({"model_type": "gigaam", "encoder": GIGAAM_V2, "head": head}))

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_features, length):
            return self.encoder(input_features.transpose(1, 2), length)[0].transpose(1, 2)
    return Encoder().eval()


def main():
    torch = torch_threads()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        module = (gigaam if args.model == "gigaam-v2" else fastconformer)(torch, folder)
        cfg, weights = conformer.load(folder)
    params = sum(p.numel() for p in module.parameters())
    frames = int(args.seconds * 100) + 1
    features = np.random.default_rng(0).standard_normal((1, frames, cfg.num_mel_bins)).astype(np.float32)
    lengths = {f"length{i}": np.int32(n) for i, n in enumerate(cfg.output_length(frames))}
    session = Session([conformer.encoder_graph(cfg, frames)], weights, device="cpu")
    x, length = torch.tensor(features), torch.tensor([frames])

    onnx_path = scratch(".onnx")
    with torch.no_grad():
        torch.onnx.export(module, (x, length), onnx_path, input_names=["features", "length"],
                          output_names=["hidden"], dynamo=False, opset_version=17)
    ort = onnx_session(onnx_path)

    def ours():
        return session.run(features=features, **lengths)["hidden"]

    def pytorch():
        with torch.no_grad():
            return module(x, length)

    def onnxruntime():
        return ort.run(None, {"features": features, "length": length.numpy()})[0]

    ref = pytorch().numpy()
    rel = np.linalg.norm(ours() - ref) / np.linalg.norm(ref)
    rel_ort = np.linalg.norm(onnxruntime() - ref) / np.linalg.norm(ref)
    print(f"{args.model} shape: {params / 1e6:.1f} M encoder parameters, {args.seconds:g} s audio "
          f"= {frames} frames -> {ref.shape[1]} encoder frames  (check: rel-L2 vs torch: ours {rel:.1e}, "
          f"onnxruntime {rel_ort:.1e})")
    med = print_table(f"encoder, batch 1, {args.seconds:g} s of audio",
                      compare({"ours": ours, "torch": pytorch, "onnxruntime": onnxruntime}, min_blocks=3))
    for name, seconds in med.items():
        print(f"  {name:<14} {seconds * 1e3 / args.seconds:9.2f} ms per second of audio "
              f"(real-time factor {seconds / args.seconds:.3f})")


if __name__ == "__main__":
    main()
