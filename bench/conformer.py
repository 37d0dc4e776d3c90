"""Conformer encoders on the CPU: our cpu backend vs PyTorch eager (transformers ParakeetEncoder) vs ONNX Runtime
(the same module exported), batch 1, 2 threads, reported as encoder milliseconds per second of audio.

    python bench/conformer.py            # FastConformer-110M shape (parakeet-tdt_ctc-110m), random weights
    python bench/conformer.py --seconds 5 --threads 1   # 1 thread is steadier on a busy 2-core machine
Needs the `reference` extra (torch, transformers, onnxruntime, onnx). The graph is the same one ConformerRecognizer runs per window.
"""
from __future__ import annotations

import argparse
import tempfile

from harness import compare, onnx_session, print_table, threads, torch_threads

parser = argparse.ArgumentParser()
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


def main():
    torch = torch_threads()
    import transformers

    torch.manual_seed(0)
    hf = transformers.ParakeetForCTC(transformers.ParakeetCTCConfig(
        vocab_size=1025, pad_token_id=1024, encoder_config=FASTCONFORMER_110M)).eval()
    params = sum(p.numel() for p in hf.encoder.parameters())
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder, safe_serialization=True)
        cfg, weights = conformer.load(folder)
    frames = int(args.seconds * 100) + 1
    features = np.random.default_rng(0).standard_normal((1, frames, 80)).astype(np.float32)
    lengths = {f"length{i}": np.int32(n) for i, n in enumerate(cfg.output_length(frames))}
    session = Session([conformer.encoder_graph(cfg, frames)], weights, device="cpu")
    x = torch.tensor(features)

    class Encoder(torch.nn.Module):  # the exporter wants tensors in, tensors out
        def __init__(self):
            super().__init__()
            self.encoder = hf.encoder

        def forward(self, input_features):
            return self.encoder(input_features=input_features).last_hidden_state

    onnx_path = tempfile.mktemp(suffix=".onnx")
    with torch.no_grad():
        torch.onnx.export(Encoder().eval(), (x,), onnx_path, input_names=["features"], output_names=["hidden"],
                          dynamo=False, opset_version=17)
    ort = onnx_session(onnx_path)

    def ours():
        return session.run(features=features, **lengths)["hidden"]

    def pytorch():
        with torch.no_grad():
            return hf.encoder(input_features=x).last_hidden_state

    def onnxruntime():
        return ort.run(None, {"features": features})[0]

    ref = pytorch().numpy()
    rel = np.linalg.norm(ours() - ref) / np.linalg.norm(ref)
    rel_ort = np.linalg.norm(onnxruntime() - ref) / np.linalg.norm(ref)
    print(f"FastConformer-110M shape: {params / 1e6:.1f} M encoder parameters, {args.seconds:g} s audio "
          f"= {frames} frames -> {ref.shape[1]} encoder frames  (check: rel-L2 vs torch: ours {rel:.1e}, "
          f"onnxruntime {rel_ort:.1e})")
    med = print_table(f"encoder, batch 1, {args.seconds:g} s of audio",
                      compare({"ours": ours, "torch": pytorch, "onnxruntime": onnxruntime}, min_blocks=3))
    for name, seconds in med.items():
        print(f"  {name:<14} {seconds * 1e3 / args.seconds:9.2f} ms per second of audio "
              f"(real-time factor {seconds / args.seconds:.3f})")


if __name__ == "__main__":
    main()
