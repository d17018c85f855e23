"""bench/embed_engines.py --write: one table in BENCHMARKS.md with a column per machine and precision;
a run rewrites its own columns and run block, between their markers, and nothing else."""
import shutil
from pathlib import Path

from bench._common import marked, read_section, replace_marked, set_columns
from bench.embed_engines import ROWS, SECTION, TABLE, columns, machine_name, write

ROOT = Path(__file__).resolve().parent.parent


def fake_result(**over) -> dict:
    """What measure() returns, with made-up numbers (no benchmark runs)."""
    row = {"cnn_img_s": 100.0, "e2e_img_s": 50.0, "load1": 1.0, "cos_to_torch": 0.9999999}
    res = {"machine": "AMD EPYC, 2 cores, 24 GiB RAM; Python 3.11.7, torch 2.13.0+cpu", "date": "2027-01-02",
           "images": 8, "device": "cpu", "cpu": "AMD EPYC", "gpu": None, "bf16_native": True,
           "command": "python bench/embed_engines.py --images 8 --write", "decoders": 2, "cores": 2,
           "gflops_per_image": 0.77, "precision": "fp32", "matmul_gflops": [77.0, 80.0], "ceiling_img_s": 200.0,
           "rows": [{"runtime": "torch", **row}, {"runtime": "openvino", **row, "cnn_img_s": 150.0}],
           "bf16": [{"runtime": "openvino, bf16", **row, "cnn_img_s": 300.0, "matmul_gflops": 385.0,
                     "ceiling_img_s": 500.0, "e2e_one_decoder": 40.0}],
           "variants": [{"runtime": "openvino", "variant": "draft decoding", "e2e_img_s": 60.0, "load1": 1.0,
                         "cos_to_full_decode": 0.98}],
           "captions": {256: {"captions_s": 5000.0, "load1": 1.0}}, "load1_end": 1.5}
    return res | over


def test_a_run_rewrites_only_its_own_columns_and_block(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    shutil.copy(ROOT / "BENCHMARKS.md", doc)
    before = doc.read_text()
    old_section = read_section(SECTION, doc)
    res = fake_result()
    assert machine_name(res) == "AMD EPYC with native bf16"
    write(res, doc)
    after, section = doc.read_text(), read_section(SECTION, doc)
    assert after.replace(section, "") == before.replace(old_section, "")  # the other sections are untouched
    table = marked(section, TABLE)
    head = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    fp32, bf16 = head.index("AMD EPYC with native bf16: fp32"), head.index("AMD EPYC with native bf16: bf16")
    rows = {(c := [x.strip() for x in ln.strip("|").split("|")])[0]: c for ln in table.splitlines()[2:]}
    assert rows["openvino: CNN alone"][fp32] == "150.0 (75 %)" and rows["openvino: CNN alone"][bf16] == "300.0 (60 %)"
    assert rows["onnxruntime: CNN alone"][fp32] == ""  # not measured in this run: its old cell goes
    assert rows["torch: CNN alone"][bf16] == ""
    # every other machine's column is as it was
    old_table = marked(old_section, TABLE)
    old_rows = {(c := [x.strip() for x in ln.strip("|").split("|")])[0]: c for ln in old_table.splitlines()[2:]}
    old_head = [c.strip() for c in old_table.splitlines()[0].strip("|").split("|")]
    for name in old_head[1:]:
        if name.startswith("AMD EPYC with native bf16"):
            continue
        i, j = old_head.index(name), head.index(name)
        assert {r: c[i] for r, c in old_rows.items()} == {r: rows[r][j] for r in old_rows}, name
    assert "7.6 (17 %)" in table and "7293.3 (2 %)" in table  # the fp32-only EPYC's and the GPU's numbers
    block = marked(section, "embed_engines:run AMD EPYC with native bf16")
    assert "Date: 2027-01-02" in block and "openvino bf16 0.9999999" in block and "1.25× faster" in block
    assert "Date: 2026-11-25" not in block and "354.9" not in section  # the old run is gone
    for other in ("AMD EPYC", "Intel(R) Xeon(R) Processor with native bf16", "NVIDIA H200"):
        assert marked(section, f"embed_engines:run {other}") == marked(old_section, f"embed_engines:run {other}")
    write(res, doc)
    assert doc.read_text() == after  # idempotent


def test_a_new_machine_adds_its_column_and_block(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    shutil.copy(ROOT / "BENCHMARKS.md", doc)
    gpu = fake_result(device="cuda", gpu="NVIDIA H100 80GB HBM3", precision="fp16 autocast", bf16_native=False,
                      bf16=[], captions=None)
    gpu.pop("captions")
    write(gpu, doc)
    section = read_section(SECTION, doc)
    head = marked(section, TABLE).splitlines()[0]
    assert head.endswith("| NVIDIA H100 80GB HBM3: fp16 autocast | NVIDIA H200: fp16 autocast |")  # the GPUs come last
    assert section.rstrip().endswith("<!-- /embed_engines:run NVIDIA H100 80GB HBM3 -->")


def test_the_section_is_created_where_there_is_none(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n## Other (x.py)\n\nkeep\n")
    write(fake_result(bf16_native=False, bf16=[]), doc)
    text = doc.read_text()
    assert "keep" in text and text.index("## Other") < text.index(SECTION)
    assert list(columns(fake_result(bf16_native=False, bf16=[]))) == ["AMD EPYC: fp32"]
    assert "| AMD EPYC: fp32 |" in marked(read_section(SECTION, doc), TABLE)


def test_set_columns_replaces_one_column_orders_rows_and_drops_empty_ones():
    table = "| | A | B |\n|---|---:|---:|\n| x | 1 | 2 |\n| y | 3 | |\n| z | | 4 |"
    out = set_columns(table, {"A": {"y": "5", "w": "6"}}, rows=["w", "x", "y"])
    assert out.splitlines() == ["| | A | B |", "|---|---:|---:|", "| w | 6 |  |", "| x |  | 2 |", "| y | 5 |  |",
                                "| z |  | 4 |"]
    out = set_columns(out, {"B": {}}, rows=["w", "x", "y"])
    assert out.splitlines()[2:] == ["| w | 6 |  |", "| y | 5 |  |"]  # x and z empty everywhere: gone
    assert set_columns("", {"C": {"x": "1"}}, rows=[]).splitlines()[0] == "| | C |"
    assert set_columns(table, {"0": {"x": "9"}}, rows=[], order=str).splitlines()[0] == "| | 0 | A | B |"


def test_replace_marked_keeps_the_markers_and_the_text_around_them():
    text = "a\n<!-- k -->\nold\n<!-- /k -->\nb\n"
    assert replace_marked(text, "k", "new") == "a\n<!-- k -->\nnew\n<!-- /k -->\nb\n"
    assert marked(replace_marked(text, "k", "new"), "k") == "new"
    assert replace_marked("a\n", "j", "x") == "a\n\n<!-- j -->\nx\n<!-- /j -->\n"
    assert marked("a", "k") is None
    assert ROWS[:2] == ["date", "ceiling (img/s)"]
