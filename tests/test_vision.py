"""Vision models: ViT, DINOv2 (with and without registers), CLIP and ResNet against committed transformers
goldens (TINY random-init checkpoints from tests/fixtures/make_vision.py), and live against transformers
when the `reference` extra is installed."""
from __future__ import annotations

import numpy as np
import pytest

from sdk.errors import InputError, UsageError, WeightError
from sdk.models import clip, module_for, resnet, vit
from sdk.session import Session
from sdk.weights import read_safetensors

from .conftest import FIXTURES

VISION = FIXTURES / "vision"
TOL = 1e-4


def golden(name: str):
    return np.load(VISION / name / "golden.npz")


@pytest.mark.parametrize("name", ["vit", "dinov2", "dinov2_reg"])
def test_vit_family_matches_transformers(name, record_parity):
    cfg, weights = vit.load(VISION / name)
    g = golden(name)
    with Session([vit.graph(cfg, 2)], weights, device="cpu") as s:
        out = s.run(pixels=g["pixels"])
    for key in ("logits", "hidden", "pooled"):
        if key in g:
            assert record_parity(f"{name}.{key}", out[key], g[key])[0] <= TOL


HEADS = {"vit": "ViTForImageClassification", "dinov2_cls": "Dinov2ForImageClassification",
         "dinov2_reg_cls": "Dinov2WithRegistersForImageClassification", "clip_cls": "CLIPForImageClassification",
         "resnet18": "ResNetForImageClassification"}


@pytest.mark.parametrize("name", HEADS)
def test_every_image_classification_head_matches_transformers(name, record_parity):
    """Each family's *ForImageClassification head (TINY random-init fixtures) through the ImageClassifier."""
    from pipelines.vision import ImageClassifier
    g = golden(name)
    with ImageClassifier(str(VISION / name), device="cpu") as clf:
        assert clf.labels[0] == "tabby cat" and len(clf.labels) == 10
        logits = clf.session.run(f"image_b1_s{clf.size}", pixels=g["pixels"][:1])["logits"]
    assert record_parity(f"{name}.head.logits", logits, g["logits"][:1])[0] <= TOL


def test_a_head_we_do_not_run_is_named_with_what_to_use(tmp_path):
    import json
    import shutil
    from pipelines.vision import ImageClassifier
    shutil.copytree(VISION / "dinov2_cls", tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "architectures": ["Dinov2ForDepthEstimation"]}))
    with pytest.raises(UsageError) as e:
        ImageClassifier(str(tmp_path / "m"), device="cpu")
    assert "Dinov2ForDepthEstimation head is not supported" in e.value.message
    assert "Dinov2ForImageClassification" in e.value.message and "ImageEmbedder" in e.value.fix


@pytest.mark.reference
@pytest.mark.parametrize("name", HEADS)
def test_live_transformers_classification_heads(name, record_parity):
    import torch
    import transformers
    from pipelines.vision import ImageClassifier
    model = getattr(transformers, HEADS[name]).from_pretrained(VISION / name).eval()
    with ImageClassifier(str(VISION / name), device="cpu") as clf:
        x = np.random.default_rng(11).normal(size=(1, 3, clf.size, clf.size)).astype(np.float32)
        ours = clf.session.run(f"image_b1_s{clf.size}", pixels=x)["logits"]
    with torch.no_grad():
        ref = model(pixel_values=torch.tensor(x)).logits.numpy()
    assert record_parity(f"live.{name}.logits", ours, ref)[0] <= TOL


@pytest.mark.parametrize("name", ["dinov2", "dinov2_reg"])
def test_dinov2_resamples_position_embeddings_at_other_sizes(name, record_parity):
    cfg, weights = vit.load(VISION / name)
    g = golden(name)
    assert cfg.image_size == 32 and g["pixels48"].shape[-1] == 48  # a 6x6 grid from the trained 4x4
    with Session([vit.graph(cfg, 1, 48)], weights, device="cpu") as s:
        hidden = s.run(pixels=g["pixels48"])["hidden"]
    assert record_parity(f"{name}.hidden48", hidden, g["hidden48"])[0] <= TOL


def test_dinov2_registers_are_read_from_the_config():
    cfg, _ = vit.load(VISION / "dinov2_reg")
    assert (cfg.variant, cfg.num_register_tokens) == ("dinov2", 2)
    g = vit.graph(cfg, 1)
    assert g.values[g.outputs["hidden"]].shape == (1, 1 + 2 + 16, 32)  # CLS, 2 registers, 4x4 patches


def test_clip_image_text_embeddings_and_logits(record_parity):
    cfg, weights = clip.load(VISION / "clip")
    g = golden("clip")
    graphs = [clip.image_graph(cfg, 2), clip.text_graph(cfg, 3, 10), clip.similarity_graph(cfg, 2, 3)]
    with Session(graphs, weights, device="cpu") as s:
        image = s.run("image_b2_s32", pixels=g["pixels"])
        text = s.run("text_b3_t10", ids=g["ids"], mask=g["mask"], eos=clip.eos_positions(g["ids"], cfg.text))
        sim = s.run("similarity_i2_t3", image_embeds=image["embeds"], text_embeds=text["embeds"])
    checks = [("image_features", image["embeds"]), ("text_features", text["embeds"]),
              ("image_embeds", sim["image_embeds"]), ("text_embeds", sim["text_embeds"]),
              ("logits_per_image", sim["logits_per_image"])]
    for key, ours in checks:
        assert record_parity(f"clip.{key}", ours, g[key])[0] <= TOL


def test_clip_pooling_position_follows_transformers_rule():
    t = clip.TINY.text
    ids = np.array([[98, 5, 7, t.eos_token_id, 1, 1], [98, t.eos_token_id, 1, 1, 1, 1]])
    assert clip.eos_positions(ids, t).tolist() == [3, 1]
    legacy = clip.TextConfig(eos_token_id=2)  # old configs: the largest id is the end-of-text token
    assert clip.eos_positions(np.array([[49406, 320, 49407, 0]]), legacy).tolist() == [2]


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnet_matches_transformers_with_folded_batch_norm(name, record_parity):
    cfg, weights = resnet.load(VISION / name)
    g = golden(name)
    assert not any("normalization" in k for k in weights)  # folded at load: the graph has no BN left
    with Session([resnet.graph(cfg, 2, 64)], weights, device="cpu") as s:
        out = s.run(pixels=g["pixels"])
    for key in ("logits", "features"):
        assert record_parity(f"{name}.{key}", out[key], g[key])[0] <= TOL


def test_batch_norm_fold_is_exact_on_a_single_conv():
    rng = np.random.default_rng(0)
    cfg = resnet.Config(embedding_size=4, hidden_sizes=(4,), depths=(1,), layer_type="basic")
    ckpt = {}
    for name, shape in resnet.checkpoint_shapes(cfg).items():
        ckpt[name] = rng.uniform(0.5, 1.5, shape).astype(np.float32) if "var" in name else \
            rng.normal(size=shape).astype(np.float32)
    folded = resnet.fold_batch_norm(ckpt, cfg)
    x = rng.normal(size=(1, 3, 9, 9)).astype(np.float32)
    w, p = ckpt["embedder.embedder.convolution.weight"], "embedder.embedder.normalization."
    y = np.asarray(resnet.ops.conv2d(x, w, None, stride=2, padding=3))
    bn = (y - ckpt[p + "running_mean"][:, None, None]) / np.sqrt(ckpt[p + "running_var"][:, None, None] + 1e-5) \
        * ckpt[p + "weight"][:, None, None] + ckpt[p + "bias"][:, None, None]
    ours = resnet.ops.conv2d(x, folded["embedder.embedder.convolution.weight"],
                             folded["embedder.embedder.convolution.bias"], stride=2, padding=3)
    assert np.abs(ours - bn).max() < 1e-4


def test_registry_knows_the_vision_model_types():
    for model_type, module in [("vit", vit), ("dinov2", vit), ("dinov2_with_registers", vit), ("clip", clip),
                               ("resnet", resnet)]:
        assert module_for(model_type) is module


def test_a_checkpoint_that_does_not_fit_is_refused(tmp_path):
    import shutil
    folder = tmp_path / "vit"
    shutil.copytree(VISION / "vit", folder)
    config = (folder / "config.json").read_text().replace('"hidden_size": 32', '"hidden_size": 48')
    (folder / "config.json").write_text(config)
    with pytest.raises(WeightError, match="misshaped"):
        vit.load(folder)


def test_wrong_input_size_is_a_usage_error():
    with pytest.raises(UsageError, match="needs 32x32"):
        vit.graph(vit.TINY["vit"], 1, 48)


def test_tiny_presets_match_the_fixtures():
    assert vit.load(VISION / "vit")[0] == vit.TINY["vit"]
    assert vit.load(VISION / "dinov2")[0] == vit.TINY["dinov2"]
    assert clip.load(VISION / "clip")[0] == clip.TINY
    assert resnet.load(VISION / "resnet18")[0] == resnet.TINY.__class__(**{**resnet.TINY.__dict__, "image_size": 224})


# ---- live against transformers (reference extra) ---------------------------------------------------------

@pytest.mark.reference
def test_live_transformers_vit_and_resnet(record_parity):
    import torch
    import transformers
    for name, cls, mod in [("vit", transformers.ViTForImageClassification, vit),
                           ("resnet18", transformers.ResNetForImageClassification, resnet)]:
        model = cls.from_pretrained(VISION / name).eval()
        cfg, weights = mod.load(VISION / name)
        x = np.random.default_rng(7).normal(size=(1, 3, 32 if name == "vit" else 64, 32 if name == "vit" else 64))
        x = x.astype(np.float32)
        with torch.no_grad():
            ref = model(pixel_values=torch.tensor(x)).logits.numpy()
        with Session([mod.graph(cfg, 1, x.shape[-1])], weights, device="cpu") as s:
            assert record_parity(f"live.{name}", s.run(pixels=x)["logits"], ref)[0] <= TOL


@pytest.mark.reference
def test_live_transformers_clip_text(record_parity):
    import torch
    import transformers
    model = transformers.CLIPModel.from_pretrained(VISION / "clip").eval()
    cfg, weights = clip.load(VISION / "clip")
    ids = np.array([[98, 10, 20, 30, 99, 1, 1, 1]], np.int32)
    mask = (np.arange(8) < 5).astype(np.float32)[None]
    with torch.no_grad():
        ref = model.get_text_features(input_ids=torch.tensor(ids, dtype=torch.long),
                                      attention_mask=torch.tensor(mask, dtype=torch.long))
    ref = getattr(ref, "pooler_output", ref).numpy()
    with Session([clip.text_graph(cfg, 1, 8)], weights, device="cpu") as s:
        ours = s.run(ids=ids, mask=mask, eos=clip.eos_positions(ids, cfg.text))["embeds"]
    assert record_parity("live.clip.text", ours, ref)[0] <= TOL


def test_fixture_checkpoints_are_safetensors_with_expected_keys():
    keys = read_safetensors(VISION / "clip" / "model.safetensors")
    assert "logit_scale" in keys and any(k.startswith("vision_model.") for k in keys)


@pytest.mark.reference
@pytest.mark.parametrize("registers", [0, 4])
def test_live_dinov2_small_geometry_runs_at_224(registers, tmp_path, record_parity):
    """Real DINOv2 checkpoints are trained at 518 (37x37 patches) and run at the processor's 224 crop (16x16):
    the position grid is resampled (bicubic; antialiased with registers). One layer keeps it quick."""
    import torch
    import transformers
    kw = dict(image_size=518, patch_size=14, hidden_size=384, num_hidden_layers=1, num_attention_heads=6)
    model = (transformers.Dinov2WithRegistersModel(transformers.Dinov2WithRegistersConfig(
        num_register_tokens=registers, **kw)) if registers else
        transformers.Dinov2Model(transformers.Dinov2Config(**kw))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    model.save_pretrained(tmp_path)
    x = np.random.default_rng(3).normal(size=(1, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        ref = model(pixel_values=torch.tensor(x)).last_hidden_state.numpy()
    cfg, weights = vit.load(tmp_path)
    with Session([vit.graph(cfg, 1, 224)], weights, device="cpu") as s:
        hidden = s.run(pixels=x)["hidden"]
    assert hidden.shape == (1, 1 + registers + 256, 384)
    assert record_parity(f"live.dinov2_518to224_reg{registers}", hidden, ref)[0] <= TOL


def test_bad_images_and_k_are_typed_errors():
    from pipelines.vision import ImageClassifier
    with ImageClassifier(str(VISION / "vit"), device="cpu") as clf:
        for bad in (None, 5, object()):  # object(): e.g. a PIL image, which is not an array
            with pytest.raises(UsageError, match="expected an image or a list of images"):
                clf.classify(bad)
        with pytest.raises(InputError, match=r"got shape \(40,\)") as e:  # its own shape, not each pixel's
            clf.classify(np.zeros(40, np.uint8))
        assert "transpose" in e.value.fix
        image = np.zeros((40, 50, 3), np.uint8)
        for k in (0, -1, "3"):  # -1 used to drop the last class
            with pytest.raises(UsageError, match="k must be a positive integer"):
                clf.classify(image, k=k)
        assert len(clf.classify(image, k=np.int64(3))) == 3


@pytest.mark.parametrize("options", [dict(top_k=0), dict(batch_size=0), dict(prompt="a photo"),
                                     dict(prompt="a {name}")])
def test_bad_vision_options_are_usage_errors(options):
    from pipelines.vision import VisionOptions
    with pytest.raises(UsageError):
        VisionOptions(**options)


@pytest.mark.parametrize("labels,message", [
    ("cat", "got the string 'cat'"),  # used to become the classes 'c', 'a', 't'
    (["cat", None], "got None"), (["cat", ""], "got ''"), (["cat", "dog", "cat"], "repeated labels: cat"),
])
def test_bad_clip_labels_are_usage_errors(labels, message):
    from pipelines.vision import ImageClassifier
    with pytest.raises(UsageError, match=message):
        ImageClassifier(str(VISION / "clip"), labels=labels, device="cpu")
