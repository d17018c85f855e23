"""bench/clip_steps.py: CLIP fine-tuning steps in several precisions, checked on a tiny CLIP on the CPU."""
import pytest

from bench.clip_steps import SECTION, clip_spec, main, render


@pytest.mark.slow
def test_the_default_model_has_vit_b32_shapes():
    c = clip_spec(tiny=False)["config"]
    v, t = c["vision_config"], c["text_config"]
    assert (v["hidden_size"], v["num_hidden_layers"], v["patch_size"], v["image_size"]) == (768, 12, 32, 224)
    assert (t["hidden_size"], t["num_hidden_layers"], t["max_position_embeddings"], c["projection_dim"]) == (512, 12, 77, 512)


@pytest.mark.slow
@pytest.mark.training
def test_tiny_run_on_the_cpu_measures_every_precision_and_loss(tmp_path, capsys):
    res = main(["--device", "cpu", "--tiny", "--precisions", "fp32,bf16", "--out", str(tmp_path / "r.json")])
    rows = res["results"]
    assert [(r["loss_fn"], r["precision"]) for r in rows] == [("infonce", "fp32"), ("infonce", "bf16"),
                                                            ("ltd", "fp32"), ("ltd", "bf16")]
    for r in rows:  # the rates are the step time's, for this batch (rounded as written)
        assert r["ms_per_step"] > 0 and r["peak_mem_gib"] is None
        assert r["steps_per_s"] == pytest.approx(1000 / r["ms_per_step"], rel=0.02)
        assert r["images_per_s"] == pytest.approx(res["batch"] * 1000 / r["ms_per_step"], rel=0.02)
    for fp32, bf16 in ((rows[0], rows[1]), (rows[2], rows[3])):
        assert bf16["speedup_vs_fp32"] == pytest.approx(fp32["ms_per_step"] / bf16["ms_per_step"], rel=0.02)
    # the same weights and batch: autocast changes the numbers a little, not the loss's scale
    for a, b in ((rows[0], rows[1]), (rows[2], rows[3])):
        assert a["speedup_vs_fp32"] == 1.0 and abs(a["mean_loss"] - b["mean_loss"]) < 0.1 * abs(a["mean_loss"])
    assert rows[2]["mean_loss"] != rows[0]["mean_loss"]  # LTD's constraint term is in the loss
    assert (tmp_path / "r.json").read_text().strip() == capsys.readouterr().out.strip()
    text = render(res)
    assert text.startswith(SECTION) and "| infonce | bf16 |" in text and "| ltd | fp32 |" in text
