"""ESM-2 on the CPU: our cpu backend vs PyTorch eager vs ONNX Runtime, one sequence of 256 tokens, 2 threads.

    python bench/esm.py                # ESM-2 35M shape (12L/480/20h), then 8M shape (6L/320/20h); random weights
    python bench/esm.py --threads 1    # 1 thread is steadier on a busy 2-core machine
Needs the `reference` extra (torch, transformers, onnxruntime, onnx). No real ESM-2 weights exist offline;
the timing does not depend on the values. Reference figures on this machine: torch ~168 ms, ORT ~144 ms (35M).
"""
from __future__ import annotations

import argparse
from dataclasses import asdict

from harness import compare, export_encoder, onnx_session, print_table, threads, torch_threads

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=2)
threads(parser.parse_args().threads)  # before numpy and torch load their thread pools

import numpy as np  # noqa: E402

from sdk.models import esm  # noqa: E402
from sdk.session import Session  # noqa: E402

SEQ = 256  # tokens: <cls> + 254 residues + <eos>


def contenders(cfg: esm.Config):
    import transformers
    torch = torch_threads()
    torch.manual_seed(0)
    hf = transformers.EsmModel(transformers.EsmConfig(**asdict(cfg)), add_pooling_layer=False).eval()
    shapes = esm.param_shapes(cfg)
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items() if k in shapes}
    assert set(weights) == set(shapes), sorted(set(shapes) - set(weights))

    rng = np.random.default_rng(0)
    ids = np.concatenate([[0], rng.integers(4, 24, SEQ - 2), [2]]).astype(np.int32)[None]
    mask = np.ones(ids.shape, np.float32)
    session = Session([esm.graph(cfg, 1, SEQ)], weights, device="cpu")
    t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    ort = onnx_session(export_encoder(torch, hf, ids, mask))
    last = f"layer_{cfg.num_hidden_layers}"

    def ours():
        return session.run(ids=ids, mask=mask)[last]

    def pytorch():
        with torch.no_grad():
            return hf(input_ids=t_ids, attention_mask=t_mask).last_hidden_state

    def onnxruntime():
        return ort.run(None, {"ids": ids.astype(np.int64), "mask": mask.astype(np.int64)})[0]

    ref = pytorch().numpy()
    print(f"  (check: max-abs vs torch: ours {np.abs(ours() - ref).max():.2e}, "
          f"onnxruntime {np.abs(onnxruntime() - ref).max():.2e})")
    return {"ours": ours, "torch": pytorch, "onnxruntime": onnxruntime}


def main():
    for name in ("esm2_t12_35M_UR50D", "esm2_t6_8M_UR50D"):
        cfg = esm.PRESETS[name]
        print_table(f"{name} shape (random weights), batch 1, {SEQ} tokens", compare(contenders(cfg)))


if __name__ == "__main__":
    main()
