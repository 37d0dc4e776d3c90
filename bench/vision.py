"""Vision models on the CPU: our cpu backend vs PyTorch eager vs ONNX Runtime, batch 1, 224x224, 2 threads.

    python bench/vision.py            # ViT-B/16 and ResNet-18 shapes, random weights (no real ones offline)
    python bench/vision.py resnet     # just one of them
Needs the `reference` extra (torch, transformers, onnxruntime, onnx). Preprocessing is timed separately
(our numpy PIL-exact resize of a 640x480 camera frame) since it is part of every classified frame.
"""
from __future__ import annotations

import sys
import tempfile
import time

from harness import compare, onnx_session, print_table, scratch, threads, torch_threads

threads(2)

import numpy as np  # noqa: E402

from sdk.models import resnet, vit  # noqa: E402
from sdk.session import Session  # noqa: E402


def contenders(graph, weights: dict, hf_model):
    torch = torch_threads()
    x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype(np.float32)
    session = Session([graph], weights, device="cpu")
    t_x = torch.tensor(x)

    class Logits(torch.nn.Module):  # the exporter wants tensors in, tensors out
        def __init__(self):
            super().__init__()
            self.model = hf_model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).logits

    onnx_path = scratch(".onnx")
    with torch.no_grad():
        torch.onnx.export(Logits().eval(), (t_x,), onnx_path, input_names=["pixels"], output_names=["logits"],
                          dynamo=False, opset_version=17)
    ort = onnx_session(onnx_path)

    def ours():
        return session.run(pixels=x)["logits"]

    def pytorch():
        with torch.no_grad():
            return hf_model(pixel_values=t_x).logits

    def onnxruntime():
        return ort.run(None, {"pixels": x})[0]

    diff = np.abs(ours() - pytorch().numpy()).max()
    print(f"  (check: max-abs ours vs torch {diff:.2e}, vs ORT {np.abs(ours() - onnxruntime()).max():.2e})")
    return {"ours": ours, "torch": pytorch, "onnxruntime": onnxruntime}


def bench_vit():
    import transformers
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(num_labels=1000)).eval()  # ViT-B/16
    with tempfile.TemporaryDirectory() as folder:  # through a saved checkpoint, as users load them
        hf.save_pretrained(folder)
        cfg, weights = vit.load(folder)
    print_table("ViT-B/16 (random weights), batch 1, 224x224", compare(contenders(vit.graph(cfg, 1), weights, hf)))


def bench_resnet():
    import torch
    import transformers
    hf = transformers.ResNetForImageClassification(transformers.ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic",
        num_labels=1000)).eval()  # ResNet-18
    with torch.no_grad():  # non-trivial batch-norm statistics, so that folding is exercised
        for name, b in hf.named_buffers():
            if name.endswith("running_var"):
                b.uniform_(0.5, 1.5)
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        cfg, weights = resnet.load(folder)
    print_table("ResNet-18 (random weights), batch 1, 224x224",
                compare(contenders(resnet.graph(cfg, 1, 224), weights, hf)))


def bench_preprocess():
    from pipelines.vision import Preprocessor
    frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    pre = Preprocessor.from_config({"image_processor_type": "ViTImageProcessor", "size": {"height": 224, "width": 224},
                                    "resample": 2})
    pre(frame)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        pre(frame)
        times.append(time.perf_counter() - t)
    print(f"\npreprocess 640x480 -> 224x224 (PIL-exact bilinear, numpy): median {np.median(times) * 1e3:.2f} ms")


def main():
    which = set(sys.argv[1:]) or {"vit", "resnet", "preprocess"}
    if "vit" in which:
        bench_vit()
    if "resnet" in which:
        bench_resnet()
    if "preprocess" in which:
        bench_preprocess()


if __name__ == "__main__":
    main()
