"""BERT encoders on the CPU: our cpu backend vs PyTorch eager vs ONNX Runtime, batch 1, seq 128, 2 threads.

    python bench/bert.py            # MiniLM-L6 (real weights) and BERT-base shape (random weights)
"ours" is the cpu backend as sessions get it (the encoder one ONNX Runtime session built from its program entry);
"onnxruntime" is ONNX Runtime on torch's export of the same model.
Needs the `reference` extra (torch, transformers, onnxruntime, onnx).
"""
from __future__ import annotations

from dataclasses import asdict

from harness import compare, export_encoder, onnx_session, print_table, threads, torch_threads

threads(2)

import numpy as np  # noqa: E402

from sdk import hub  # noqa: E402
from sdk.models import bert  # noqa: E402
from sdk.session import Session  # noqa: E402

SEQ = 128


def contenders(cfg: bert.Config, weights: dict, hf_model):
    torch = torch_threads()
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 2000, size=(1, SEQ)).astype(np.int32)
    zeros, mask = np.zeros_like(ids), np.ones(ids.shape, np.float32)
    session = Session([bert.graph(cfg, 1, SEQ)], weights, device="cpu")
    t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    ort = onnx_session(export_encoder(torch, hf_model, ids, mask))

    def ours():
        return session.run(ids=ids, token_types=zeros, mask=mask)["hidden"]

    def pytorch():
        with torch.no_grad():
            return hf_model(input_ids=t_ids, attention_mask=t_mask).last_hidden_state

    def onnxruntime():
        return ort.run(None, {"ids": ids.astype(np.int64), "mask": mask.astype(np.int64)})[0]

    diff = np.abs(ours() - pytorch().numpy()).max()
    print(f"  (check: max-abs ours vs torch {diff:.2e})")
    return {"ours": ours, "torch": pytorch, "onnxruntime": onnxruntime}


def main():
    import transformers
    torch_threads()
    folder = hub.resolve("all-MiniLM-L6-v2").path
    cfg, weights = bert.load(folder)
    print_table("MiniLM-L6 (all-MiniLM-L6-v2), batch 1, seq 128",
                compare(contenders(cfg, weights, transformers.BertModel.from_pretrained(str(folder)).eval())))

    base = bert.Config()  # bert-base shape, random weights
    hf = transformers.BertModel(transformers.BertConfig(**asdict(base)), add_pooling_layer=False).eval()
    weights = {k: v.detach().numpy() for k, v in hf.state_dict().items() if k in bert.param_shapes(base)}
    print_table("BERT-base shape (random weights), batch 1, seq 128", compare(contenders(base, weights, hf)))


if __name__ == "__main__":
    main()
